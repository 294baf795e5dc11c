"""The agent's own heartbeats keep a thinking or streaming run alive in the watchdog's eyes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from workers.core.run_health import RunStatus
from workers.gateway.client import ToolGateway
from workers.settings import Settings
from workers.store.events import read_events
from workers.store.sessions import SessionStore
from workers.watchdog.alerts import AlertSink
from workers.watchdog.sweep import Watchdog

pytestmark = pytest.mark.timeout(30)

STALLED_AFTER_S = 120


class Clock:
    def __init__(self) -> None:
        self.now_s = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def gateway(settings: Settings, clock: Clock) -> Iterator[ToolGateway]:
    gw = ToolGateway(settings, clock=clock)
    yield gw
    gw.close()


def _classes(settings: Settings, gateway: ToolGateway, now_s: float, *, server_side: bool) -> dict[str, int]:
    sink = AlertSink()
    sink.emit = lambda event: None  # type: ignore[method-assign]
    tuned = settings.model_copy(
        update={"watchdog": settings.watchdog.model_copy(update={"stalled_after_s": STALLED_AFTER_S})}
    )
    store = SessionStore(gateway._rt.ledger)
    watchdog = Watchdog(store, tuned, writer="wd", alerts=sink, server_side=server_side)
    report = watchdog.sweep(int(now_s * 1000))
    return report.classes


@pytest.mark.parametrize("server_side", [True, False], ids=["scripts", "pipelined"])
def test_a_streaming_run_is_never_stuck_and_a_silent_one_is(
    gateway: ToolGateway, settings: Settings, clock: Clock, server_side: bool
) -> None:
    # Given two runs that start with a model turn and never call a tool
    assert gateway.heartbeat("streams", "r1", what="model stream")
    assert gateway.heartbeat("silent", "r1", what="model stream")
    start = clock.now_s
    # When one streams for five stalled-thresholds with a chunk every 10 s, the other says nothing
    while clock.now_s < start + 5 * STALLED_AFTER_S:
        clock.now_s += 10
        assert gateway.heartbeat("streams", "r1", what="model stream")
    # Then the sweep finds the silent run stuck and leaves the streaming one alone (not quiet)
    classes = _classes(settings, gateway, clock.now_s, server_side=server_side)
    assert classes == {"stuck": 1}
    store = SessionStore(gateway._rt.ledger)
    silent, info = store.run("silent", "r1"), store.run("streams", "r1")
    assert silent is not None
    assert info is not None
    assert silent.klass == "stuck"
    assert info.klass not in {"stalled", "stuck"}
    assert (info.agent_beat_what, info.agent_beat_ms) == ("model stream", int(clock.now_s * 1000))


def test_heartbeats_are_throttled_and_stop_once_the_run_ended(gateway: ToolGateway, clock: Clock) -> None:
    store = SessionStore(gateway._rt.ledger)
    assert gateway.heartbeat("s", "r1")
    first = store.run("s", "r1")
    assert first is not None
    # A chunk 0.5 s later writes nothing; one 1 s later does
    clock.now_s += 0.5
    assert gateway.heartbeat("s", "r1")
    assert store.run("s", "r1") == first
    clock.now_s += 0.5
    assert gateway.heartbeat("s", "r1")
    later = store.run("s", "r1")
    assert later is not None
    assert later.progress_ms == first.progress_ms + 1000
    # Once the run ended, a heartbeat says so
    assert gateway.end_run("s", "r1")
    clock.now_s += 1
    assert not gateway.heartbeat("s", "r1")


def test_an_idle_stream_is_recorded_on_the_run_and_in_the_events(gateway: ToolGateway) -> None:
    # Given a running run
    gateway.heartbeat("idle", "r1")
    # When its model stream goes idle twice
    gateway.note_stream_idle("idle", "r1", idle_timeout_s=90)
    gateway.note_stream_idle("idle", "r1", idle_timeout_s=90)
    # Then the run counts both, and the events stream carries them
    info = SessionStore(gateway._rt.ledger).run("idle", "r1")
    assert info is not None
    assert info.stream_idles == 2
    kinds = [fields["kind"] for _, fields in read_events(gateway._rt.ledger, "0-0", block_ms=1)]
    assert kinds.count("stream_idle") == 2


def test_end_run_takes_a_run_status_or_its_value(gateway: ToolGateway) -> None:
    # Given two running runs
    assert gateway.heartbeat("enum", "r1")
    assert gateway.heartbeat("text", "r1")
    # When one is ended with the enum and the other with its value (the HTTP door's JSON)
    assert gateway.end_run("enum", "r1", RunStatus.ABORTED)
    assert gateway.end_run("text", "r1", "timed_out")
    # Then both are stored alike, and a value that is no run status is refused
    store = SessionStore(gateway._rt.ledger)
    assert [info.status for info in store.runs([("enum", "r1"), ("text", "r1")])] == ["aborted", "timed_out"]
    with pytest.raises(ValueError, match="finished"):
        gateway.end_run("enum", "r1", "finished")
