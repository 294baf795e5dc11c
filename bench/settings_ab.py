"""Two settings of one tree, throughput at 8 clients, finely alternated (``python -m bench.settings_ab``).

``python -m bench.settings_ab --rounds 16 UNSTUCK_WORKER__GIVE_BACK_AFTER_MS=0
UNSTUCK_WORKER__GIVE_BACK_AFTER_MS=250`` starts one ``unstuck worker`` per side (its own queue,
one private redis-server for both), then measures each side's throughput alone (the other
worker frozen), A then B, B then A, for ``--rounds`` rounds of a few seconds each, and prints
each round's B ÷ A and their median.

Why not ``bench.overhead_pairs``: on a shared 2-core host the speed drifts by up to half from one
minute to the next, more than a setting usually changes; a round here lasts seconds, so A and B
of one round see the same machine. Each side's environment is the shipped settings (the lease
too, and the worker's line per task) plus its assignments.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable

from bench.overhead import Guarded, shipped_env, throughput
from bench.overhead_probes import freeze, thaw
from tests.harness import Proc, base_env, kill_pids, settings_of, start_worker
from workers.local.embedded_redis import EmbeddedRedis
from workers.settings import Settings


def _assignments(text: str) -> dict[str, str]:
    """``NAME=value[,NAME=value...]`` as a dict (one side's settings)."""
    pairs = [part.split("=", 1) for part in text.split(",") if part]
    if not pairs or any(len(pair) != 2 or not pair[0].startswith("UNSTUCK_") for pair in pairs):
        raise argparse.ArgumentTypeError(f"expected UNSTUCK_NAME=value[,UNSTUCK_NAME=value...], got {text!r}")
    return dict((name, value) for name, value in pairs)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.settings_ab", description=__doc__.split("\n")[0])
    parser.add_argument("a", type=_assignments, help="side A: UNSTUCK_NAME=value[,...]")
    parser.add_argument("b", type=_assignments, help="side B: UNSTUCK_NAME=value[,...]")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--calls-per-thread", type=int, default=250)
    return parser.parse_args(argv)


def _round(
    index: int, workers: dict[str, Proc], settings: dict[str, Settings], args: argparse.Namespace
) -> dict[str, float]:
    """One round: each side alone, in alternating order; its calls per second."""
    order = ("a", "b") if index % 2 == 0 else ("b", "a")
    rates = {}
    for side in order:
        freeze(workers["b" if side == "a" else "a"])
        thaw(workers[side])
        clients = _clients(settings[side], f"{side}-{index}")
        rates[side] = throughput(clients, args.threads, args.calls_per_thread)
    return rates


def _clients(settings: Settings, prefix: str) -> Callable[[int], Guarded]:
    """Client ``t`` of a phase: its own gateway and session."""
    return lambda t: Guarded(settings, f"{prefix}-{t}")


def main(argv: list[str] | None = None) -> int:
    """Start both workers, alternate the rounds, print each ratio and the median."""
    args = _parse(argv)
    with EmbeddedRedis() as server:
        envs = {
            side: base_env(server.url, **{**shipped_env(), "UNSTUCK_BROKER__QUEUE": f"ab-{side}", **extra})
            for side, extra in (("a", args.a), ("b", args.b))
        }
        workers = {side: start_worker(env, concurrency=2, name=f"ab-{side}") for side, env in envs.items()}
        settings = {side: settings_of(env) for side, env in envs.items()}
        ratios = []
        try:
            for index in range(args.rounds):
                rates = _round(index, workers, settings, args)
                ratios.append(rates["b"] / rates["a"])
                print(
                    f"round {index}: A {rates['a']:.0f}/s, B {rates['b']:.0f}/s, B/A {ratios[-1]:.3f}",
                    flush=True,
                )
        finally:
            for worker in workers.values():
                thaw(worker)
                kill_pids(worker.children())
                worker.stop()
    ahead = sum(ratio > 1 for ratio in ratios)
    print(
        f"B/A throughput at {args.threads} clients: median {statistics.median(ratios):.3f}, "
        f"mean {statistics.mean(ratios):.3f}, B ahead in {ahead} of {len(ratios)} rounds"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
