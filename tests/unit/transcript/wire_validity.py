"""Count, per wire format, how many generated damaged transcripts repair makes valid.

Run: ``python -m tests.unit.transcript.wire_validity [examples]``. The examples are derandomized,
so two code versions see the same transcripts.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings

from tests.unit.transcript.wire_rules import attribution_problems, judge, repair_wire
from tests.unit.transcript.wire_scenarios import FORMATS, Scenario, scenarios


def outcome(scenario: Scenario) -> tuple[bool, bool, bool]:
    """(valid for the SDK and the API rules, no result lost or misattributed, idempotent)."""
    try:
        once = repair_wire(scenario.fmt, scenario.wire())
        verdict = judge(scenario.fmt, once)
        twice = repair_wire(scenario.fmt, once)
    except Exception:  # noqa: BLE001 - a crash counts as an invalid outcome
        return False, False, False
    return not verdict.problems, not attribution_problems(scenario, verdict), twice == once


def tally(fmt: str, examples: int) -> Counter[str]:
    counts: Counter[str] = Counter()

    @settings(
        max_examples=examples,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(scenarios(fmt))
    def run(scenario: Any) -> None:
        valid, attributed, idempotent = outcome(scenario)
        counts["total"] += 1
        counts["valid"] += valid
        counts["attributed"] += attributed
        counts["idempotent"] += idempotent
        counts["all"] += valid and attributed and idempotent

    run()
    return counts


def main() -> None:
    examples = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    print(f"{'format':18} {'total':>6} {'valid':>6} {'attributed':>10} {'idempotent':>10} {'all':>6}")
    for fmt in FORMATS:
        c = tally(fmt, examples)
        print(
            f"{fmt:18} {c['total']:6} {c['valid']:6} {c['attributed']:10} {c['idempotent']:10} {c['all']:6}"
        )


if __name__ == "__main__":
    main()
