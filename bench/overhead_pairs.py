"""``bench.overhead`` on two commits, one after the other, in alternating pairs.

``python -m bench.overhead_pairs --pairs 3 BEFORE AFTER -- --paths '' --no-faults --rounds 3
--calls-per-thread 300`` checks each commit out in a git worktree of its own (under a temporary
directory, removed afterwards), then runs ``python -m bench.overhead`` with the arguments after
``--`` in BEFORE's worktree, then in AFTER's, ``--pairs`` times, and prints each run's summary
(the sync path's ratios and the CPU per call by process). Both run with this checkout's
virtualenv; each run has its Redis and workers to itself.

Why pairs: the ratios move from one hour to the next with the machine (docs/performance.md
has runs of the same commit 0.15 apart), so two commits are compared run against run, not
against a figure from earlier in the day.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.harness import REPO

# The lines of bench.overhead's output a comparison reads: the sync path's table and the CPU
# per call (and cores busy) by process.
_SUMMARY = (
    "p50 latency (ms)",
    "throughput (calls/s)",
    "CPU per call (ms)",
    "Redis cmds per call",
    "CPU ms per call by process",
    "cores busy during",
    "  bare     client",
    "  guarded  client",
)


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    args = sys.argv[1:] if argv is None else argv
    own, bench = (args[: args.index("--")], args[args.index("--") + 1 :]) if "--" in args else (args, [])
    parser = argparse.ArgumentParser(
        prog="python -m bench.overhead_pairs", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("before", help="a commit (or anything git rev-parse takes)")
    parser.add_argument("after", help="the commit to compare with it")
    parser.add_argument("--pairs", type=int, default=3)
    return parser.parse_args(own), bench


def _worktree(root: Path, rev: str, name: str) -> Path:
    path = root / name
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), rev], check=True)
    return path


def _run(tree: Path, bench: list[str]) -> list[str]:
    """One ``bench.overhead`` run in ``tree``; its summary lines (its last error lines if it failed)."""
    argv = [sys.executable, "-m", "bench.overhead", *bench]
    done = subprocess.run(argv, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return [f"failed (exit {done.returncode}):", *done.stderr.strip().splitlines()[-5:]]
    return [line for line in done.stdout.splitlines() if line.startswith(_SUMMARY)]


def main(argv: list[str] | None = None) -> int:
    """Run the pairs; exit 1 if a commit cannot be checked out, 0 whatever the figures are."""
    opts, bench = _parse(argv)
    with tempfile.TemporaryDirectory(prefix="overhead-pairs-") as tmp:
        root = Path(tmp)
        trees: list[tuple[str, Path]] = []
        try:
            for name, rev in (("before", opts.before), ("after", opts.after)):
                trees.append((f"{name} {rev}", _worktree(root, rev, name)))
            for pair in range(1, opts.pairs + 1):
                for label, tree in trees:
                    print(f"== pair {pair}/{opts.pairs}, {label}", flush=True)
                    for line in _run(tree, bench):
                        print(line, flush=True)
        except subprocess.CalledProcessError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            for _, tree in trees:
                remove = ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)]
                subprocess.run(remove, check=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
