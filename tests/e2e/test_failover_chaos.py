"""The failover soaks (``python -m bench.chaos --faults failover|cluster-failover``) as e2e tests.

Each runs the soak in a subprocess with a fixed seed for well under a minute of faults:

* Sentinel: a primary, one replica and three Sentinels on loopback; six agents; the primary
  SIGKILLed (restarted once the replica is promoted: it rejoins as a replica), then the new
  primary SIGSTOPped for 2-15 s, with worker kills and gateway restarts beside them;
* Redis Cluster: 3 primaries with a replica each, one primary SIGKILLed and restarted.

The soak's checker keeps its history outside Redis (what each agent was handed, every
execution a tool began) and exits non-zero on any violation: a call without exactly one
delivered result, a delivered result the ledger does not hold, an answer later than its
deadline + grace + the failover allowance, duplicate executions over 1% of calls. Every
invariant must hold on both legs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from tests.e2e.conftest import clean_env
from tests.harness import REPO

pytestmark = [pytest.mark.slow]

SEED = 31
_SOAK = [sys.executable, "-m", "bench.chaos"]


def _soak(faults: str, minutes: float) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*_SOAK, "--faults", faults, "--minutes", str(minutes), "--sessions", "6", "--seed", str(SEED)],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    print(done.stdout[-5000:], done.stderr[-2000:])
    return done


def _assert_passed(done: subprocess.CompletedProcess[str], faults: str) -> None:
    figures = dict(re.findall(r"\b(missing|duplicates|stuck sessions) (\d+)", done.stdout))
    assert figures == {"missing": "0", "duplicates": "0", "stuck sessions": "0"}, done.stdout[-3000:]
    failovers = re.search(r"failovers (\d+) of (\d+) episodes", done.stdout)
    assert failovers is not None, done.stdout[-3000:]
    assert int(failovers.group(1)) >= 1, done.stdout[-3000:]
    assert re.search(r"calls [1-9]\d*, results", done.stdout), "the soak made calls"
    assert re.findall(r"INVARIANT FAILED: (.*)", done.stdout) == [], done.stdout[-3000:]
    assert f"chaos: PASS seed {SEED} faults {faults}" in done.stdout, done.stdout[-3000:]
    assert done.returncode == 0


# The soak bounds itself (its drain gives up after 120 s and prints where sessions wait): a
# timeout here only catches a soak that hangs past its own bounds.
@pytest.mark.timeout(420)
def test_sentinel_failover_soak_delivers_one_result_per_call() -> None:
    done = _soak("failover", 0.75)
    _assert_passed(done, "failover")
    kinds = re.findall(r"episode (primary \w+)", done.stdout)
    assert kinds[:2] == ["primary SIGKILL", "primary SIGSTOP"], done.stdout[-3000:]


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli creates the cluster")
@pytest.mark.timeout(420)
def test_cluster_failover_soak_delivers_one_result_per_call() -> None:
    done = _soak("cluster-failover", 0.5)
    _assert_passed(done, "cluster-failover")
