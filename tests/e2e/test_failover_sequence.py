"""Two failovers in a row lose nothing (issue 42): ``python -m bench.failover_sequence`` as e2e tests.

The primary SIGKILLed at 10 s, restarted at 25 s (it rejoins as a replica), the promoted
primary SIGSTOPped for 6 s at 35 s, six agents calling through the Python gateway or
``unstuck serve``. On one replica with default settings the restarted old primary may be
promoted before it has copied what the promoted one took: every answer handed on must still be
in the ledger at the end, as it was handed on, and on time. On two replicas the same.

Each run picks a seed and prints it (``UNSTUCK_FAILOVER_SEED`` replays one): a failure is a
bug to trace with that seed, never a run to repeat. ``make test-failover-ci`` runs this file
(about 3 minutes on 2 cores, two legs at a time) and prints each leg's figures (``-rP``).
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys

import pytest

from tests.e2e.conftest import clean_env
from tests.harness import REPO

pytestmark = [pytest.mark.slow]

_FIGURES = re.compile(
    r"failover-sequence: (PASS|FAIL) seed (\d+) replicas (\d) door (\w+): calls (\d+), missing (\d+),"
    r" differing (\d+), late (\d+), unanswered (\d+), duplicates (\d+)"
)


def _seed() -> int:
    chosen = os.environ.get("UNSTUCK_FAILOVER_SEED")
    return int(chosen) if chosen else random.SystemRandom().randrange(1, 2**31)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("replicas", "door"), [(1, "python"), (1, "http"), (2, "python"), (2, "http")])
def test_two_failovers_in_a_row_lose_no_answer(replicas: int, door: str) -> None:
    seed = _seed()
    print(f"failover sequence: seed {seed} replicas {replicas} door {door}", flush=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.failover_sequence",
            "--replicas",
            str(replicas),
            "--door",
            door,
            "--seed",
            str(seed),
        ],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    found = _FIGURES.search(done.stdout)
    assert found is not None, done.stdout[-3000:] + done.stderr[-3000:]
    print(found.string[found.start() :].splitlines()[0], flush=True)  # the figures, with the seed and time
    verdict, _, _, _, calls, missing, differing, late, unanswered, duplicates = found.groups()
    assert int(calls) > 100, "the agents made calls through the faults"
    assert (missing, differing, late, unanswered) == ("0", "0", "0", "0"), done.stdout[-4000:]
    assert int(duplicates) <= int(calls) // 100, done.stdout[-4000:]
    assert verdict == "PASS"
    assert done.returncode == 0
