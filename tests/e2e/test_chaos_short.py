"""A shortened chaos soak (``python -m bench.chaos --minutes 0.5``) as an e2e test.

Runs the soak in a subprocess: hangs, crashes, worker SIGKILLs, a Redis AOF restart and
gateway restarts with ``collect``. The soak itself checks the invariants (missing 0,
duplicates 0, nothing differing from the ledger, every batch back by its latest deadline +
grace, stuck sessions 0) and exits non-zero when one fails.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.e2e.conftest import clean_env
from tests.harness import REPO

pytestmark = [pytest.mark.slow]


# The soak bounds itself (its drain gives up after 120 s and prints where sessions wait):
# a timeout here would hide that report, so it only catches a soak that hangs past its bounds.
@pytest.mark.timeout(330)
def test_short_chaos_soak_loses_nothing_and_answers_nothing_twice() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.chaos", "--minutes", "0.5", "--sessions", "8"],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=320,
        check=False,
    )
    print(done.stdout[-4000:], done.stderr[-2000:])
    figures = dict(re.findall(r"\b(missing|duplicates|stuck sessions) (\d+)", done.stdout))
    assert figures == {"missing": "0", "duplicates": "0", "stuck sessions": "0"}, done.stdout[-2000:]
    assert re.search(r"calls [1-9]\d*, results", done.stdout), "the soak made calls"
    assert "chaos: PASS" in done.stdout
    assert done.returncode == 0
