"""A run's calls key expires at an absolute time past its calls' deadlines (run_indexes.RunKeysTtl)."""

from __future__ import annotations

import pytest

from workers.store.keys import REFRESH_INTERVAL_S
from workers.store.run_indexes import RunKeysTtl

STEP_MS = REFRESH_INTERVAL_S * 1000


@pytest.mark.parametrize("deadline_ms", [0, 1, STEP_MS - 1, STEP_MS, 10 * STEP_MS + 7, 1_796_495_137_823])
def test_the_key_outlives_a_record_of_that_deadline_and_stops_on_a_step(deadline_ms: int) -> None:
    until = RunKeysTtl(100).until_ms(deadline_ms)
    # A record lives ttl_s + one interval + ceil to a second past its deadline
    assert until >= deadline_ms + 100_000 + STEP_MS + 1000
    assert until - (deadline_ms + 100_000 + STEP_MS + 1000) < STEP_MS
    assert until % STEP_MS == 0


def test_calls_within_one_interval_share_the_time_so_one_pexpire_serves_them() -> None:
    ttl = RunKeysTtl(100)
    first = ttl.until_ms(50 * STEP_MS)
    after_ms = 100_000 + STEP_MS + 1000  # a record's life past its deadline
    assert {ttl.until_ms(first - ms) for ms in range(after_ms, after_ms + STEP_MS)} == {first}
    assert ttl.until_ms(first - after_ms + 1) == first + STEP_MS
