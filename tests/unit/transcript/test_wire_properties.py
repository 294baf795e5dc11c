"""Repair's output in every wire format, checked with the providers' own SDK types and API rules.

Hypothesis generates damaged transcripts (missing, duplicate, orphan, displaced and late results,
several calls per turn, illegal, too long and repeated ids, aborted calls, empty texts, OpenClaw
placeholders). Properties: the repaired transcript passes the SDK's types and the API's pairing,
id and turn rules; no real result is lost or attached to another call; a second repair changes
nothing. ``UNSTUCK_REPAIR_EXAMPLES`` sets the examples per format (``make test-repair-deep``).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

from tests.unit.transcript.wire_scenarios import FORMATS, Scenario, scenarios

EXAMPLES = int(os.environ.get("UNSTUCK_REPAIR_EXAMPLES", "300"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_repaired_wire_transcripts_are_valid_attributed_and_stable(fmt: str) -> None:
    # Imported here, not at collection: wire_rules loads the providers' SDKs (seconds), which
    # every pytest-xdist worker would pay although only one of them runs this test.
    from tests.unit.transcript.wire_rules import attribution_problems, judge, repair_wire

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(scenarios(fmt))
    def check(scenario: Scenario) -> None:
        # Given a damaged transcript; When it is repaired
        once = repair_wire(fmt, scenario.wire())
        # Then the provider's SDK and API rules accept it, and every real result is where it belongs
        verdict = judge(fmt, once)
        assert verdict.problems == []
        assert attribution_problems(scenario, verdict) == []
        # And a second repair changes nothing
        assert repair_wire(fmt, once) == once

    check()
