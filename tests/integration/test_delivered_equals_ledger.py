"""What the gateway hands the agent is what the ledger holds, even when Redis vanished mid-wait.

The race the chaos soak found (seed 609129078): Redis restarted while a gateway waited; at the
call's deadline plus half the grace the gateway answered locally ("deadline_exceeded ...
(result store unreachable)"), and once Redis was back the watchdog stored its own, different
deadline text. Here the same order of events is played deterministically: a waiter whose
store is unreachable (a closed port), then the watchdog on the real store, then the gateway's
persister once Redis "is back".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from workers.answering.service import Answers
from workers.core.models import ToolCall, ToolResult
from workers.core.results import answer_by_deadline, deadline_result, success_result
from workers.gateway._sync.waiter import Waiter
from workers.gateway.batch import Batch
from workers.gateway.deferred_answers import Persister
from workers.settings import Settings
from workers.store.connection import connect
from workers.store.ledger import Ledger
from workers.watchdog.due_calls import sweep_due_calls

pytestmark = pytest.mark.timeout(30)

T0 = 1_800_000_000_000
DEADLINE_MS = T0 + 10_000


class FakeClock:
    """Milliseconds that move only when the code under test sleeps."""

    def __init__(self, now_ms: int) -> None:
        self.now = now_ms

    def __call__(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(1, int(seconds * 1000))


@pytest.fixture
def ledger(redis_url: str) -> Iterator[Ledger]:
    client = connect(redis_url, socket_timeout_s=2, socket_connect_timeout_s=1)
    yield Ledger(client, prefix="t", ttl_s=3600, lease_ttl_ms=3000)
    client.close()


@pytest.fixture
def unreachable() -> Ledger:
    # Port 1 refuses at once: every store call fails fast, like Redis in the middle of a restart.
    client = connect("redis://127.0.0.1:1/0", socket_timeout_s=0.2, socket_connect_timeout_s=0.2)
    return Ledger(client, prefix="t", ttl_s=3600, lease_ttl_ms=3000)


def _canonical(result: ToolResult) -> str:
    return json.dumps(result.model_dump(mode="json"), sort_keys=True)


def _register(ledger: Ledger, call: ToolCall) -> None:
    keys = ledger.keys("s", "r1")
    fields = {"tool": call.name, "dispatched": "1", "task_id": "t-1"}
    assert ledger.register(keys, call.id, now_ms=T0, deadline_ms=DEADLINE_MS, fields=fields)


def _wait_without_store(
    unreachable: Ledger, call: ToolCall, clock: FakeClock, stored: Persister
) -> ToolResult:
    settings = Settings(redis={"url": "redis://127.0.0.1:1/0"})
    waiter = Waiter(
        unreachable,
        settings,
        "gw",
        clock,
        clock.sleep,
        redispatch=lambda keys, call_id: None,
        store_later=stored.store_later,
    )
    batch = Batch(unreachable.keys("s", "r1"))
    batch.deadlines[call.id] = DEADLINE_MS
    batch.submitted[call.id] = T0
    batch.tools[call.id] = call.name
    answers = waiter.wait(batch)
    assert batch.answers == {}  # the waiter returns what it learned; the batch is the gateway's
    return answers[call.id]


@pytest.fixture
def returning(redis_url: str, ledger: Ledger) -> Iterator[tuple[Ledger, Callable[[], object]]]:
    """A ledger whose Redis refuses it (its ACL user is off) until the returned switch is thrown."""
    ledger.client.acl_setuser(
        "late", enabled=False, passwords=["+pw"], keys=["*"], channels=["*"], commands=["+@all"]
    )
    url = redis_url.replace("redis://", "redis://late:pw@", 1)
    client = connect(url, socket_timeout_s=2, socket_connect_timeout_s=1)
    yield (
        Ledger(client, prefix="t", ttl_s=3600, lease_ttl_ms=3000),
        lambda: ledger.client.acl_setuser("late", enabled=True),
    )
    client.close()
    ledger.client.acl_deluser("late")


def test_local_answer_then_watchdog_then_persister_agree(
    ledger: Ledger, unreachable: Ledger, returning: tuple[Ledger, Callable[[], object]]
) -> None:
    # Given a registered, dispatched call that no worker will ever answer
    call = ToolCall(id="c1", name="slow")
    _register(ledger, call)
    clock = FakeClock(T0 + 1_000)
    gateway_ledger, redis_is_back = returning
    persister = Persister(gateway_ledger, answers=Answers(writer="gw", fallbacks={}), now_ms=clock)
    # When the gateway waits while Redis is gone: it answers locally, on time
    delivered = _wait_without_store(unreachable, call, clock, persister)
    grace_ms = int(Settings(redis={"url": "redis://x:1/0"}).gateway.grace_s * 1000)
    assert DEADLINE_MS <= clock.now <= DEADLINE_MS + grace_ms
    # ... and the watchdog, on the store once it is back, answers the overdue call first
    answered = sweep_due_calls(
        ledger, now_ms=clock.now + 500, settings=Settings(redis={"url": "redis://x:1/0"}), writer="wd"
    )
    assert answered == 1
    # ... then the gateway's persister stores what it delivered (late: the watchdog won)
    redis_is_back()
    assert persister.drain(timeout_s=10)
    # Then what the agent got is byte-identical to what the ledger holds
    stored = ledger.results(ledger.keys("s", "r1"), ["c1"])["c1"]
    assert stored == delivered
    assert _canonical(stored) == _canonical(delivered)  # the same bytes as the ledger stores them
    assert delivered == deadline_result(call, submitted_ms=T0, deadline_ms=DEADLINE_MS)
    assert "unreachable" not in delivered.text
    assert "its limit" not in delivered.text


def test_the_persister_stores_the_local_answer_when_nobody_else_did(
    ledger: Ledger, unreachable: Ledger
) -> None:
    # Given a call whose answer the gateway handed over while Redis was gone
    call = ToolCall(id="c2", name="slow")
    _register(ledger, call)
    clock = FakeClock(T0 + 1_000)
    persister = Persister(ledger, answers=Answers(writer="gw", fallbacks={}), now_ms=clock)
    delivered = _wait_without_store(unreachable, call, clock, persister)
    # When Redis is back before any watchdog sweep
    assert persister.drain(timeout_s=10)
    # Then the ledger holds the delivered answer, written by the gateway
    keys = ledger.keys("s", "r1")
    assert ledger.results(keys, ["c2"])["c2"] == delivered
    record = ledger.record(keys, "c2")
    assert record is not None
    assert record.fields["writer"] == "gw"


def test_a_tool_result_after_the_deadline_is_kept_as_late_and_never_wins() -> None:
    # Given a tool that finished 1 ms after its call's deadline
    call = ToolCall(id="c3", name="slow")
    result = success_result(call, "done", elapsed_ms=10_001, attempt=1)
    # When the worker decides what to store
    late = answer_by_deadline(result, call, submitted_ms=T0, deadline_ms=DEADLINE_MS, now_ms=DEADLINE_MS)
    on_time = answer_by_deadline(
        result, call, submitted_ms=T0, deadline_ms=DEADLINE_MS, now_ms=DEADLINE_MS - 1
    )
    # Then past the deadline only the canonical deadline answer may be stored; before it, the result
    assert late == deadline_result(call, submitted_ms=T0, deadline_ms=DEADLINE_MS)
    assert on_time is result
