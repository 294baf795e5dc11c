"""Repair's output in every wire format, checked with the providers' own SDK types and API rules.

Hypothesis generates damaged transcripts (missing, duplicate, orphan, displaced and late results,
several calls per turn, illegal, too long and repeated ids, aborted calls, empty texts, OpenClaw
placeholders). Properties: the repaired transcript passes the SDK's types and the API's pairing,
id and turn rules; no real result is lost or attached to another call; a second repair changes
nothing. Gemini without ids is held to its own rule as well: the turn right after the calls
answers them by position. ``UNSTUCK_REPAIR_EXAMPLES`` sets the examples per format
(``make test-repair-deep``).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

from tests.unit.transcript.wire_scenarios import FORMATS, Scenario, scenarios

EXAMPLES = int(os.environ.get("UNSTUCK_REPAIR_EXAMPLES", "300"))

# On one xdist worker: each process that runs one of these imports every provider's SDK
# (about 3 CPU-seconds), so spread over four workers they paid it four times.
pytestmark = pytest.mark.xdist_group("provider_sdks")


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


def test_gemini_id_less_responses_answer_by_position() -> None:
    from tests.unit.transcript.wire_rules import judge, positional_problems, repair_wire

    # Two tool names only, so that turns hold several calls of one name
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(scenarios("gemini", names=("read", "exec"), ids=False, positional=True))
    def check(scenario: Scenario) -> None:
        # Given a damaged Gemini transcript without ids; When it is repaired
        wire = scenario.wire()
        once = repair_wire("gemini", wire)
        # Then the SDK and the API rules accept it, and each response answers the call its position names
        assert judge("gemini", once).problems == []
        assert positional_problems(wire, once) == []
        # And a second repair changes nothing
        assert repair_wire("gemini", once) == once

    check()
