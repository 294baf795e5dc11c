"""Repair throughput on a 10,000-message transcript, against a plain JSON copy as the baseline.

Run: ``python -m bench.repair``
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from workers.core.transcript import repair_pairing, repair_transcript, resolve_policy

MESSAGES = 10_000
ROUNDS = 5


def build_transcript(size: int = MESSAGES) -> list[dict[str, Any]]:
    """A transcript of ``size`` messages with gaps, duplicates, orphans and displaced results."""
    messages: list[dict[str, Any]] = []
    turn = 0
    while len(messages) < size:
        ids = [f"call_{turn}_{i}" for i in range(3)]
        messages.append({"role": "user", "content": f"step {turn}"})
        calls = [{"type": "toolCall", "id": i, "name": "read", "arguments": {"n": turn}} for i in ids]
        messages.append({"role": "assistant", "content": calls})
        kind = turn % 5
        answered = ids[:2] if kind == 0 else ids  # gap: third call never answered
        if kind == 3:
            messages.append({"role": "user", "content": "interjection"})  # displaces results
        for call_id in reversed(answered) if kind == 2 else answered:
            messages.append(_result(call_id))
        if kind == 1:
            messages.append(_result(ids[0]))  # duplicate
        if kind == 4:
            messages.append(_result(f"ghost_{turn}"))  # orphan
        turn += 1
    return messages[:size]


def _result(call_id: str) -> dict[str, Any]:
    content = [{"type": "text", "text": "ok"}]
    return {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": "read",
        "content": content,
        "isError": False,
    }


def best_seconds(run: Callable[[], object], rounds: int = ROUNDS) -> float:
    """The fastest of ``rounds`` runs, to keep scheduler noise out."""
    timings = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        timings.append(time.perf_counter() - start)
    return min(timings)


def main() -> None:
    """Measure and print messages/second for each repair path and the JSON-copy baseline."""
    transcript = build_transcript()
    policy = resolve_policy("mistral")
    anthropic, google = resolve_policy("anthropic"), resolve_policy("google")
    baseline = best_seconds(lambda: json.loads(json.dumps(transcript)))
    paths: dict[str, Callable[[], object]] = {
        "pairing only": lambda: repair_pairing(transcript),
        "full pipeline (mistral)": lambda: repair_transcript(transcript, policy),
        "full pipeline (anthropic)": lambda: repair_transcript(transcript, anthropic),
        "full pipeline (google)": lambda: repair_transcript(transcript, google),
    }
    print(f"transcript: {len(transcript)} messages, best of {ROUNDS} rounds")
    print(f"{'json round-trip copy (baseline)':32} {len(transcript) / baseline:>12,.0f} msg/s")
    for name, run in paths.items():
        seconds = best_seconds(run)
        ratio = seconds / baseline
        print(f"{name:32} {len(transcript) / seconds:>12,.0f} msg/s  ({ratio:.2f}x the copy's time)")


if __name__ == "__main__":
    main()
