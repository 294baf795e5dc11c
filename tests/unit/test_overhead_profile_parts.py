"""``bench.overhead_profile`` sorts samples by frame names: each name it looks for must exist.

A renamed class or method (the sync ledger client became a generated ``LedgerClient``) does
not fail the profile: its samples fall through to "other" and the shares read wrong.
"""

from __future__ import annotations

import re
from pathlib import Path

from bench.overhead_profile import PARTS

ROOT = Path(__file__).resolve().parents[2]
METHOD = re.compile(r"^([A-Z]\w*)\.(\w+)$")  # Class.method
SOURCES = [path.read_text() for path in sorted((ROOT / "workers").rglob("*.py"))]


def _defines(source: str, cls: str, method: str) -> bool:
    match = re.search(rf"^class {cls}\b.*?(?=^class |\Z)", source, re.M | re.S)
    return match is not None and re.search(rf"^\s+(async )?def {method}\(", match.group(0), re.M) is not None


def _class_methods() -> list[tuple[str, str]]:
    """The profile's frames of the form ``Class.method`` whose class is one of ours."""
    frames = {frame for parts in PARTS.values() for frame, _ in parts}
    pairs = [(m[1], m[2]) for frame in sorted(frames) if (m := METHOD.match(frame))]
    return [(cls, method) for cls, method in pairs if any(f"class {cls}" in s for s in SOURCES)]


def test_every_class_method_frame_the_profile_matches_is_defined_in_workers() -> None:
    ours = _class_methods()
    assert {("LedgerClient", "register_call"), ("LedgerClient", "claim"), ("LedgerClient", "finish")} <= set(
        ours
    )
    missing = [f"{c}.{m}" for c, m in ours if not any(_defines(source, c, m) for source in SOURCES)]
    assert not missing, f"the profile looks for frames no class defines: {missing}"
