"""Where a guarded call's CPU goes, per process (``python -m bench.overhead_profile``).

One private redis-server and one ``unstuck worker`` (two pool processes); ``--threads``
gateways in this process's threads call the no-op tool for ``--seconds`` while py-spy (not a
dependency: ``.venv/bin/pip install py-spy``) samples this process, the worker's main
process and each pool child with ``--gil``: only samples of a thread holding the GIL count,
the Python CPU of the process, which a loaded machine distorts less than wall time. Each
process's samples are sorted into the parts of a call (first match of the stack, in order)
and printed as shares; ``--keep DIR`` keeps py-spy's raw stacks.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.overhead import Guarded, shipped_env
from tests.harness import REPO, base_env, kill_pids, settings_of, start_worker
from workers.local.embedded_redis import EmbeddedRedis
from workers.settings import Settings

# Per process: (a frame's text in the stack, the part of a call it stands for), first match wins.
# The ledger's round trips are methods of the client generated from workers/store/_async/
# (``LedgerClient`` on the sync side): a renamed frame falls through to "other".
PARTS: dict[str, list[tuple[str, str]]] = {
    "gateway": [
        ("TaskMessages.build", "message build (as_task_v2, kwargsrepr)"),
        ("LedgerClient.register_call", "register round trip"),
        ("wait_for_results", "wait (BLPOP) and answer parsing"),
        ("TaskEvents", "task-sent events"),
        ("_registration_fields", "record fields, digest"),
        ("call_tools", "other gateway logic"),
        ("", "other (client threads, GC)"),
    ],
    "worker main": [
        ("_brpop", "BRPOP (kombu poller)"),
        ("Logger.", "logging"),
        ("ResultHandler", "pool results (billiard)"),
        ("send_event", "task events"),
        ("RefusingConsumer._flush_buffered_events", "task events"),
        ("EventDispatcher", "task events"),
        ("LeaseKeeping", "lease keeper thread"),
        ("", "event loop, pool writes, other"),
    ],
    "pool children": [
        ("LedgerClient.claim", "claim round trip"),
        ("LedgerClient.finish", "finish round trip"),
        ("MemoryGuard", "memory limit (cgroup re-arm)"),
        ("Logger.", "logging (Celery's task lines, redaction)"),
        ("saferepr", "saferepr of the return value"),
        ("job_digest", "job digest"),
        ("model_validate", "job validation"),
        ("answer_call", "other worker logic"),
        ("fast_trace_task", "Celery trace"),
        ("", "billiard pool loop, IPC"),
    ],
}


def shares(role: str, raw_files: list[Path]) -> list[tuple[str, float]]:
    """Each part's share of ``role``'s samples in py-spy's raw output files."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for path in raw_files:
        for line in path.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            total += int(n)
            part = next(name for frame, name in PARTS[role] if frame in stack)
            counts[part] += int(n)
    names = dict.fromkeys(name for _, name in PARTS[role])  # in order, each once
    return [(name, counts[name] / total) for name in names if counts[name]] if total else []


def main(argv: list[str] | None = None) -> int:
    """Load the worker, sample every process, print the shares."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.overhead_profile", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--keep", type=Path, help="directory to keep py-spy's raw stacks in")
    args = parser.parse_args(argv)
    spy = shutil.which(
        "py-spy", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    )
    if spy is None:
        print("py-spy not found: .venv/bin/pip install py-spy")
        return 1
    sys.path.insert(0, str(REPO))
    out = args.keep or Path(tempfile.mkdtemp(prefix="unstuck-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    with EmbeddedRedis() as server:
        env = base_env(server.url, **shipped_env())
        settings = settings_of(env)
        worker = start_worker(env, concurrency=2, name="profile")
        try:
            calls = _load_and_sample(spy, settings, worker.pid, worker.children(), args, out)
        finally:
            kill_pids(worker.children())
            worker.stop()
    print(
        f"{calls} calls in {args.seconds} s sampled, {args.threads} gateways; py-spy --gil shares per process"
    )
    files = {
        "gateway": [out / "gateway.txt"],
        "worker main": [out / "main.txt"],
        "pool children": sorted(out.glob("child*.txt")),
    }
    for role, paths in files.items():
        print(f"{role}:")
        for name, share in shares(role, [p for p in paths if p.exists()]):
            print(f"  {share * 100:5.1f}%  {name}")
    return 0


def _load_and_sample(
    spy: str, settings: Settings, main_pid: int, children: list[int], args: argparse.Namespace, out: Path
) -> int:
    clients = [Guarded(settings, f"profile-{t}") for t in range(args.threads)]
    for client in clients:
        client(10_000_000)  # connected before sampling starts
    stop = time.monotonic() + args.seconds + 2
    done: list[int] = []

    def run(client: Guarded) -> None:
        n = 0
        while time.monotonic() < stop:
            client(n)
            n += 1
        done.append(n)

    threads = [threading.Thread(target=run, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    time.sleep(1)
    targets = [
        ("gateway", os.getpid()),
        ("main", main_pid),
        *((f"child{i}", pid) for i, pid in enumerate(children)),
    ]
    spies = [
        subprocess.Popen(
            [spy, "record", "--gil", "--nonblocking", "-r", "200", "-d", str(args.seconds), "-p", str(pid),
             "-f", "raw", "-o", str(out / f"{name}.txt")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in targets
    ]  # fmt: skip
    for thread in threads:
        thread.join()
    for proc in spies:
        proc.wait()
    for client in clients:
        client.close()
    return sum(done)


if __name__ == "__main__":
    raise SystemExit(main())
