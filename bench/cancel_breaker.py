"""What cancellation and the shared circuit breaker save, against a baseline in the same run.

One private redis-server, one ``unstuck worker`` (exec enabled, ``limits.cancel_grace_s`` 1 s).

* cancel: an ``exec`` of ``sleep 3`` (its shell plus a backgrounded child) is cancelled 0.5 s
  after it started; the time from ``cancel()`` to the answer, against the same command left
  to run (baseline: its run time), and for a group that ignores SIGTERM (bounded by the grace);
* breaker: N sessions each call a tool whose upstream is down and hangs until its soft limit
  (``sleepy``, 1 s); with ``tools.breakers.sleepy`` (failures 2) against without, total and
  per-call wall time.

Nothing is asserted; run ``python -m bench.cancel_breaker``.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from collections.abc import Callable

from tests.harness import REPO, base_env, kill_pids, settings_of, start_worker, wait_until
from workers import ToolCall, ToolGateway, ToolResult
from workers.local.embedded_redis import EmbeddedRedis
from workers.runtime import open_ledger

ROUNDS = 5
SESSIONS = 8
COMMAND = "sleep 3 & sleep 3; wait"
TRAPPED = "trap '' TERM; sleep 3 & sleep 3; wait"


def _timed_exec(
    gw: ToolGateway, session: str, command: str, cancel_after_s: float | None
) -> tuple[float, str]:
    """Seconds from the cancel (or from the start, without one) to the answer, and its reason."""
    ledger = open_ledger(gw.settings)
    out: dict[str, list[ToolResult]] = {}
    calls = [ToolCall(id="c1", name="exec", arguments={"command": command})]
    runner = threading.Thread(
        target=lambda: out.update(r=gw.call_tools(session_key=session, run_id="r1", calls=calls))
    )
    began = time.monotonic()
    runner.start()
    if cancel_after_s is not None:
        keys = ledger.keys(session, "r1")
        wait_until(lambda: bool(ledger.process_groups(keys, "c1")), timeout_s=30, what="the exec to start")
        time.sleep(cancel_after_s)  # the point of the measurement: a command that has been running a while
        began = time.monotonic()
        gw.cancel(session, "r1", "c1")
    runner.join(60)
    ledger.close()
    (result,) = out["r"]
    return time.monotonic() - began, str(result.reason or "ok")


def _median(run: Callable[[int], tuple[float, str]]) -> tuple[float, set[str]]:
    samples = [run(n) for n in range(ROUNDS)]
    return statistics.median(s for s, _ in samples), {r for _, r in samples}


def cancel_figures(gw: ToolGateway) -> None:
    base_s, base_reasons = _median(lambda n: _timed_exec(gw, f"full-{n}", COMMAND, None))
    cancel_s, cancel_reasons = _median(lambda n: _timed_exec(gw, f"cancel-{n}", COMMAND, 0.5))
    trap_s, trap_reasons = _median(lambda n: _timed_exec(gw, f"trap-{n}", TRAPPED, 0.5))
    print(f"cancel  exec left to run:             {base_s:6.3f} s  {sorted(base_reasons)}  (baseline)")
    print(
        f"cancel  exec cancelled (SIGTERM):     {cancel_s:6.3f} s  {sorted(cancel_reasons)}  "
        f"ratio {cancel_s / base_s:.3f}"
    )
    print(f"cancel  exec ignoring SIGTERM:        {trap_s:6.3f} s  {sorted(trap_reasons)}  "
          f"ratio {trap_s / base_s:.3f} (grace 1 s)")  # fmt: skip


def outage(gw: ToolGateway, tag: str) -> tuple[float, list[str]]:
    """SESSIONS sessions, one after another, each calling the hanging tool once."""
    began = time.monotonic()
    reasons = []
    for n in range(SESSIONS):
        call = ToolCall(id="c1", name="sleepy", arguments={"seconds": 30})
        (result,) = gw.call_tools(session_key=f"{tag}-{n}", run_id="r1", calls=[call])
        reasons.append(str(result.reason))
    return time.monotonic() - began, reasons


def main() -> int:
    """Run both measurements and print them."""
    sys.path.insert(0, str(REPO))
    policy = {"sleepy": {"failures": 2, "window_s": 60, "cooldown_s": 60}}
    with EmbeddedRedis() as server:
        env = base_env(server.url, UNSTUCK_TOOLS__BUILTINS="exec", UNSTUCK_LIMITS__CANCEL_GRACE_S="1")
        worker = start_worker(env, name="bench-cancel")
        try:
            plain = ToolGateway(settings_of(env))
            cancel_figures(plain)
            base_s, base_reasons = outage(plain, "plain")
            guarded = ToolGateway(settings_of({**env, "UNSTUCK_TOOLS__BREAKERS": json.dumps(policy)}))
            open_s, open_reasons = outage(guarded, "breaker")
            print(
                f"breaker {SESSIONS} sessions, no breaker:       {base_s:6.3f} s  {base_reasons}  (baseline)"
            )
            print(f"breaker {SESSIONS} sessions, breaker (2 fails): {open_s:6.3f} s  {open_reasons}  "
                  f"ratio {open_s / base_s:.3f}")  # fmt: skip
            plain.close()
            guarded.close()
        finally:
            kill_pids(worker.children())
            worker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
