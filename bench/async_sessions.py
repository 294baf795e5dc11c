"""Many sessions in one event loop (``python -m bench.async_sessions``): native async vs a thread each.

One private redis-server and one ``unstuck worker`` (2 processes). ``--sessions`` sessions call
at once from one event loop: the first 20 a healthy tool, every other one a hung tool with a
short deadline that the worker cannot reach in time. Run twice, same calls:

* ``acall_tools`` (the wait awaited on asyncio: no thread per waiting call);
* the baseline, ``asyncio.to_thread(call_tools)`` (what ``acall_tools`` was before: a thread
  of the loop's default pool per call, so calls queue for threads).

For each: how long submission took (call start to the ledger's submitted time), when each
answer arrived against its call's deadline (from the ledger) plus the grace, and the caller's
whole wait against its call's time budget plus the grace (what queueing for submission
adds). The target: every answer by deadline + grace. Printed PASS or MISS; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tests.harness import base_env, settings_of, start_worker
from workers import ToolCall, ToolGateway, ToolResult
from workers.local.embedded_redis import EmbeddedRedis
from workers.store.records import CallField

HEALTHY = 20

Caller = Callable[[ToolGateway, str, ToolCall], Awaitable[list[ToolResult]]]


@dataclass(frozen=True)
class Answer:
    """One session: its result and when it arrived (wall ms), and when it started."""

    session: str
    result: ToolResult
    started_ms: int
    received_ms: int


async def _native(gateway: ToolGateway, session: str, call: ToolCall) -> list[ToolResult]:
    return await gateway.acall_tools(session_key=session, run_id="r1", calls=[call])


async def _threaded(gateway: ToolGateway, session: str, call: ToolCall) -> list[ToolResult]:
    return await asyncio.to_thread(gateway.call_tools, session_key=session, run_id="r1", calls=[call])


async def _session(gateway: ToolGateway, caller: Caller, session: str, n: int) -> Answer:
    if n < HEALTHY:
        call = ToolCall(id="c", name="echo", arguments={"text": f"hi {n}"})
    else:
        call = ToolCall(id="c", name="sleepy", arguments={"seconds": 60})
    started_ms = int(time.time() * 1000)
    [result] = await caller(gateway, session, call)
    return Answer(session, result, started_ms, int(time.time() * 1000))


async def _run(gateway: ToolGateway, caller: Caller, label: str, sessions: int) -> list[Answer]:
    try:
        return await asyncio.gather(*(_session(gateway, caller, f"{label}-{n}", n) for n in range(sessions)))
    finally:
        await gateway.aclose()


def _report(label: str, gateway: ToolGateway, answers: list[Answer]) -> None:
    ledger = gateway._rt.ledger
    grace_ms = int(gateway.settings.gateway.grace_s * 1000)
    submit_ms: list[int] = []
    over_ms: list[int] = []
    caller_over_ms: list[int] = []
    reasons: dict[str, int] = {}
    for one in answers:
        record = ledger.record(ledger.keys(one.session, "r1"), "c")
        assert record is not None
        submit_ms.append(record.row.integer(CallField.SUBMITTED_MS) - one.started_ms)
        deadline_ms = record.row.integer(CallField.DEADLINE_MS)
        over_ms.append(one.received_ms - deadline_ms - grace_ms)
        # The caller's view: its whole wait against the call's time budget plus the grace.
        budget_ms = deadline_ms - record.row.integer(CallField.SUBMITTED_MS)
        caller_over_ms.append(one.received_ms - one.started_ms - budget_ms - grace_ms)
        reason = one.result.reason or "ok"
        reasons[reason] = reasons.get(reason, 0) + 1
    over_ms.sort()
    late = sum(1 for ms in over_ms if ms > 0)
    print(f"{label}: {len(answers)} sessions, reasons {reasons}")
    print(f"  submission took p50 {statistics.median(submit_ms):.0f} ms, max {max(submit_ms)} ms")
    p99 = over_ms[min(len(over_ms) - 1, int(len(over_ms) * 0.99))]
    p50 = over_ms[len(over_ms) // 2]
    print(f"  answer vs deadline + grace: p50 {p50:+d} ms, p99 {p99:+d}, max {over_ms[-1]:+d}")
    print(f"  past deadline + grace: {late}  {'PASS' if late == 0 else 'MISS'}")
    caller_over_ms.sort()
    print(
        f"  caller's wait vs its call's budget + grace (submission queueing included): "
        f"p50 {caller_over_ms[len(caller_over_ms) // 2]:+d} ms, max {caller_over_ms[-1]:+d}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run both sides and print them."""
    parser = argparse.ArgumentParser(prog="python -m bench.async_sessions")
    parser.add_argument("--sessions", type=int, default=1000)
    args = parser.parse_args(argv)
    with EmbeddedRedis() as server:
        env = base_env(
            server.url, UNSTUCK_LIMITS__QUEUE_ALLOWANCE_S="1", UNSTUCK_TOOLS__TIMEOUTS_S='{"sleepy": 0.5}'
        )
        settings = settings_of(env)
        worker = start_worker(env, concurrency=2, name="bench-async")
        try:
            for label, caller in (("native", _native), ("to_thread", _threaded)):
                gateway = ToolGateway(settings)
                answers = asyncio.run(_run(gateway, caller, label, args.sessions))
                reader = ToolGateway(settings)
                _report(f"{label:>9}", reader, answers)
                reader.close()
        finally:
            worker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
