"""What the HTTP door costs, and how many waiting requests it holds (``python -m bench.http_door``).

One private redis-server, one ``unstuck worker``, one ``unstuck serve``. Each side alone:

* latency: the same no-op call, sequentially, through the Python gateway (the baseline a
  Python agent would use) and then over HTTP (one keep-alive connection), p50 and p99, and
  the ratio;
* concurrency: ``--waiting`` clients (one thread and connection each) post at once a call
  that no worker will take (its tool's queue has no consumer), so every request waits until
  the call's deadline; each must be answered by deadline + grace, none lost.

The targets (HTTP adds <= 1 ms p50 per call; >= 1000 concurrent waiting requests)
are printed PASS or MISS; nothing is asserted.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tests.harness import UNSTUCK, Proc, base_env, settings_of, start_worker
from workers import ToolCall, ToolGateway
from workers.local.embedded_redis import EmbeddedRedis, free_port
from workers.settings import Settings
from workers.store.records import CallField

NOOP = {"calls": [{"id": "c", "name": "noop", "arguments": {}}]}


@dataclass(frozen=True)
class Options:
    """Sizes of the run."""

    calls: int
    waiting: int


def _parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.http_door", description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="sequential calls per side")
    parser.add_argument("--waiting", type=int, default=1000, help="concurrent waiting HTTP requests")
    args = parser.parse_args(argv)
    return Options(args.calls, args.waiting)


def _post(conn: http.client.HTTPConnection, path: str, body: object) -> dict[str, object]:
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = json.loads(response.read())
    if response.status != 200:
        raise AssertionError(f"{response.status}: {data}")
    return dict(data)


def _percentiles(samples_ms: list[float]) -> tuple[float, float]:
    ordered = sorted(samples_ms)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _python_side(settings: Settings, calls: int) -> list[float]:
    gateway = ToolGateway(settings)
    try:
        samples = []
        for n in range(calls):
            started = time.perf_counter()
            gateway.call_tools(session_key="bench-py", run_id="r1", calls=[ToolCall(id=f"p{n}", name="noop")])
            samples.append((time.perf_counter() - started) * 1000)
        return samples
    finally:
        gateway.close()


def _http_side(port: int, calls: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    samples = []
    for n in range(calls):
        body = {"format": "neutral", "message": {"calls": [{"id": f"h{n}", "name": "noop", "arguments": {}}]}}
        started = time.perf_counter()
        _post(conn, "/v1/sessions/bench-http/runs/r1/tool-calls", body)
        samples.append((time.perf_counter() - started) * 1000)
    conn.close()
    return samples


@dataclass(frozen=True)
class Waited:
    """One waiting request: how long the client waited, when it got its answer, and why."""

    seconds: float
    received_ms: int
    reason: str


def _one_waiting(port: int, n: int) -> Waited:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    started = time.perf_counter()
    body = {"format": "neutral", "message": {"calls": [{"id": "w", "name": "noop", "arguments": {}}]}}
    answer = _post(conn, f"/v1/sessions/bench-wait-{n}/runs/r1/tool-calls", body)
    received_ms = int(time.time() * 1000)
    conn.close()
    results = answer["results"]
    assert isinstance(results, list)
    return Waited(time.perf_counter() - started, received_ms, str(results[0]["details"].get("reason")))


def _waiting(port: int, count: int) -> list[Waited]:
    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(lambda n: _one_waiting(port, n), range(count)))


def _late_ms(settings: Settings, waited: list[Waited]) -> list[int]:
    """How long after its call's deadline (from the ledger) each answer reached its client."""
    gateway = ToolGateway(settings)
    try:
        ledger = gateway._rt.ledger
        late = []
        for n, one in enumerate(waited):
            record = ledger.record(ledger.keys(f"bench-wait-{n}", "r1"), "w")
            deadline_ms = record.row.integer(CallField.DEADLINE_MS) if record else 0
            late.append(one.received_ms - deadline_ms if deadline_ms else 0)
        return late
    finally:
        gateway.close()


def main(argv: list[str] | None = None) -> int:
    """Run both measurements and print them."""
    options = _parse(argv)
    with EmbeddedRedis() as server:
        env = base_env(server.url, UNSTUCK_TOOLS__TIMEOUTS_S='{"noop": 1.0}')
        settings = settings_of(env)
        port = free_port()
        worker = start_worker(env, concurrency=2, name="bench-http")
        serve = Proc([UNSTUCK, "serve", "--port", str(port)], env, "bench-serve")
        try:
            serve.wait_for_log("Uvicorn running on", timeout_s=30)
            python_ms = _python_side(settings, options.calls)
            http_ms = _http_side(port, options.calls)
            worker.stop()  # from here no worker consumes the tool queue: every call waits its deadline
            deadline_s = settings.limits.queue_allowance_s + 1.0 + settings.limits.hard_grace_s
            waited = _waiting(port, options.waiting)
            late_ms = _late_ms(settings, waited)
        finally:
            serve.stop()
            worker.stop()
    py50, py99 = _percentiles(python_ms)
    h50, h99 = _percentiles(http_ms)
    print(f"latency, {options.calls} sequential no-op calls per side (each side alone)")
    print(f"  python gateway  p50 {py50:7.2f} ms  p99 {py99:7.2f} ms")
    print(f"  http (serve)    p50 {h50:7.2f} ms  p99 {h99:7.2f} ms")
    verdict = "PASS" if h50 - py50 <= 1 else "MISS"
    print(f"  http adds {h50 - py50:+.2f} ms p50 (ratio {h50 / py50:.2f})  {verdict}")
    grace_ms = int(settings.gateway.grace_s * 1000)
    reasons: dict[str, int] = {}
    for one in waited:
        reasons[one.reason] = reasons.get(one.reason, 0) + 1
    late = sum(1 for ms in late_ms if ms > grace_ms)
    print(f"{options.waiting} concurrent waiting requests (calls nobody takes; deadline {deadline_s:.1f} s)")
    print(f"  answered {len(waited)}, reasons {reasons}")
    print(f"  client wait: slowest {max(w.seconds for w in waited):.2f} s; answer vs the call's deadline:")
    print(f"  worst {max(late_ms):+d} ms, answered past deadline + grace ({grace_ms} ms): {late}")
    # A call nobody takes must be answered at its deadline: dispatch_failed means the door
    # could not even submit it (what thread exhaustion looked like).
    held = len(waited) == options.waiting and late == 0 and set(reasons) == {"deadline_exceeded"}
    print(f"  {'PASS' if held else 'MISS'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
