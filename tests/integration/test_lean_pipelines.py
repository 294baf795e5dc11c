"""The store's lean pipeline answers as redis-py's does, and never leaves a reply for another command.

:mod:`workers.store.pipelines` sends a claim or an answer with less Python than redis-py's
pipeline, on a connection it may keep out of the pool. These tests hold it to what redis-py's
pipeline gives: the same replies, error replies in place, a connection that is either in step
or closed, a lost connection sent again, and no connection shared across threads or a fork.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
from collections.abc import Iterator
from types import FrameType

import pytest
import redis
from redis.exceptions import DataError, NoScriptError, ResponseError

from workers.local.embedded_redis import EmbeddedRedis
from workers.store.connection import connect
from workers.store.pipelines import LeanPipeline, pipeline

_SCRIPT = "redis.call('SET', KEYS[1], ARGV[1]); return {ARGV[1], tonumber(ARGV[2]) + 1}"


@pytest.fixture
def client(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    found = connect(redis_server.url, socket_timeout_s=3.0, socket_connect_timeout_s=1.0)
    found.flushall()
    yield found
    found.close()


def _fill(pipe: object, sha: str, tag: str) -> None:
    pipe.execute_command("EVALSHA", sha, 1, f"k:{tag}", tag, 41)  # type: ignore[attr-defined]
    pipe.zadd(f"z:{tag}", {"a": 1, "b": 2})  # type: ignore[attr-defined]
    pipe.zadd(f"z:{tag}", {"a": 5}, xx=True, gt=True)  # type: ignore[attr-defined]
    pipe.expire(f"z:{tag}", 60)  # type: ignore[attr-defined]
    pipe.hset(f"h:{tag}", mapping={"f": "v", "n": 3})  # type: ignore[attr-defined]
    pipe.hgetall(f"h:{tag}")  # type: ignore[attr-defined]
    pipe.zrange(f"z:{tag}", 0, -1, withscores=True)  # type: ignore[attr-defined]


def test_replies_are_redis_pys_own(client: redis.Redis) -> None:
    # Given the same commands, sent once through each pipeline on fresh keys
    sha = client.script_load(_SCRIPT)
    lean = pipeline(client)
    assert isinstance(lean, LeanPipeline)
    _fill(lean, sha, "lean")
    theirs = client.pipeline(transaction=False)
    _fill(theirs, sha, "redis-py")
    # Then each reply is the same, response callbacks included (a bool, a dict, scored pairs)
    replies = lean.execute()
    assert replies[0] == ["lean", 42]
    assert replies[1:] == theirs.execute()[1:]
    assert replies[3] is True
    assert replies[5] == {"f": "v", "n": "3"}
    assert replies[6] == [("b", 2.0), ("a", 5.0)]


def test_an_error_reply_stays_in_place_and_the_next_pipeline_reads_its_own(client: redis.Redis) -> None:
    # Given a pipeline whose second command fails (LPUSH on a string)
    client.set("s", "x")
    pipe = pipeline(client)
    pipe.get("s")
    pipe.lpush("s", 1)
    pipe.incr("n")
    # When it is read without raising, the error is in its place and the commands after it ran
    replies = pipe.execute(raise_on_error=False)
    assert replies[0] == "x"
    assert isinstance(replies[1], ResponseError)
    assert replies[2] == 1
    # And raising, the error is the reply's own class, and the connection is still in step
    raising = pipeline(client)
    raising.lpush("s", 1)
    raising.incr("n")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        raising.execute()
    after = pipeline(client)
    after.get("n")
    assert after.execute() == ["2"]


def test_a_script_a_restart_lost_raises_noscript(client: redis.Redis) -> None:
    # Given a script the server does not hold (what a Redis restart leaves)
    sha = client.script_load(_SCRIPT)
    client.script_flush()
    pipe = pipeline(client)
    pipe.execute_command("EVALSHA", sha, 1, "k", "v", 1)
    # Then it raises redis-py's NoScriptError, which the ledger's clients answer by loading it
    with pytest.raises(NoScriptError):
        pipe.execute()


def test_a_lost_connection_is_sent_again(client: redis.Redis) -> None:
    # Given the connection the lean pipeline keeps, killed by the server between two uses
    first = pipeline(client)
    first.client_id()
    (held_id,) = first.execute()
    client.client_kill_filter(_id=held_id)
    # When the next pipeline is sent, it reaches the server all the same, on another connection
    pipe = pipeline(client)
    pipe.incr("after-kill")
    pipe.client_id()
    count, other_id = pipe.execute()
    assert count == 1
    assert other_id != held_id
    assert client.get("after-kill") == "1"


class _Interrupt(BaseException):
    """What a soft time limit or a cancel looks like to the code it interrupts."""


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise _Interrupt


def test_an_interrupted_read_leaves_no_reply_for_the_next_pipeline(client: redis.Redis) -> None:
    # Given a pipeline blocked in a read (BLPOP of an empty list for 1 s), cut short at 0.2 s
    assert threading.current_thread() is threading.main_thread()
    blocked = pipeline(client)
    blocked.blpop(["never-filled"], timeout=1)
    previous = signal.signal(signal.SIGALRM, _interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(_Interrupt):
            blocked.execute()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    # Then the next pipeline (on the same kept connection, were it still open) reads its own
    # reply, not the BLPOP's nil that would come at 1 s
    pipe = pipeline(client)
    pipe.echo("mine")
    assert pipe.execute() == ["mine"]


def test_threads_never_share_a_connection(client: redis.Redis) -> None:
    # Given 8 threads, each sending 200 pipelines whose replies name their thread
    errors: list[str] = []

    def send(tag: str) -> None:
        for i in range(200):
            pipe = pipeline(client)
            pipe.echo(f"{tag}:{i}")
            pipe.echo(f"{tag}:{i}:second")
            reply = pipe.execute()
            if reply != [f"{tag}:{i}", f"{tag}:{i}:second"]:
                errors.append(f"{tag}:{i} read {reply}")

    threads = [threading.Thread(target=send, args=(f"t{n}",)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Then every thread read its own replies
    assert errors == []


def _child_ids(client: redis.Redis, out: multiprocessing.Queue[tuple[int, str]]) -> None:
    pipe = pipeline(client)
    pipe.client_id()
    pipe.echo("child")
    reply = pipe.execute()
    out.put((reply[0], reply[1]))


def test_a_forked_child_uses_a_connection_of_its_own(client: redis.Redis) -> None:
    # Given the parent's kept connection
    pipe = pipeline(client)
    pipe.client_id()
    (parent_id,) = pipe.execute()
    # When a forked child sends a pipeline
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[tuple[int, str]] = ctx.Queue()
    child = ctx.Process(target=_child_ids, args=(client, out))
    child.start()
    child_id, echoed = out.get(timeout=10)
    child.join(timeout=10)
    # Then it used its own connection, and the parent's is still in step
    assert echoed == "child"
    assert child_id != parent_id
    again = pipeline(client)
    again.client_id()
    again.echo("parent")
    assert again.execute() == [parent_id, "parent"]


def test_an_argument_hiredis_cannot_pack_is_refused_as_redis_py_refuses_it(client: redis.Redis) -> None:
    pipe = pipeline(client)
    pipe.set("flag", True)
    with pytest.raises(DataError):
        pipe.execute()


def test_a_pool_other_than_a_plain_one_gets_its_connection_back(redis_server: EmbeddedRedis) -> None:
    # Given a client on a blocking pool (as a Sentinel pool, not a plain one)
    pool = redis.BlockingConnectionPool.from_url(redis_server.url, max_connections=1, timeout=1)
    blocking = redis.Redis(connection_pool=pool)
    try:
        # Then each pipeline hands its one connection back: the second would wait for it
        for n in range(2):
            pipe = pipeline(blocking)
            pipe.echo(str(n))
            assert pipe.execute() == [str(n).encode()]
        assert blocking.ping() is True
    finally:
        blocking.close()
