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
ROUNDS = 15
BASELINE = "json round-trip copy (baseline)"


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


def best_seconds(runs: dict[str, Callable[[], object]], rounds: int = ROUNDS) -> dict[str, float]:
    """The fastest of ``rounds`` runs of each path, taken in turn round by round.

    Interleaving puts the baseline and every path under the same load on a shared machine; the
    minimum keeps scheduler noise out.
    """
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def main() -> None:
    """Measure and print messages/second for each repair path and the JSON-copy baseline."""
    transcript = build_transcript()
    mistral, anthropic, google = (resolve_policy(p) for p in ("mistral", "anthropic", "google"))
    paths: dict[str, Callable[[], object]] = {
        BASELINE: lambda: json.loads(json.dumps(transcript)),
        "pairing only": lambda: repair_pairing(transcript),
        "full pipeline (mistral)": lambda: repair_transcript(transcript, mistral),
        "full pipeline (anthropic)": lambda: repair_transcript(transcript, anthropic),
        "full pipeline (google)": lambda: repair_transcript(transcript, google),
    }
    best = best_seconds(paths)
    print(f"transcript: {len(transcript)} messages, best of {ROUNDS} interleaved rounds")
    print(f"{BASELINE:32} {len(transcript) / best[BASELINE]:>12,.0f} msg/s")
    for name, seconds in best.items():
        if name != BASELINE:
            ratio = seconds / best[BASELINE]
            print(f"{name:32} {len(transcript) / seconds:>12,.0f} msg/s  ({ratio:.2f}x the copy's time)")


if __name__ == "__main__":
    main()
