"""Results leave the worker capped and with secrets masked; logs are masked too."""

from __future__ import annotations

import logging

import pytest

from workers.core import ToolCall, success_result
from workers.core.redact import RedactingFilter
from workers.worker.execution import bounded_result

CALL = ToolCall(id="c1", name="exec")


def test_small_clean_result_is_returned_unchanged() -> None:
    result = success_result(CALL, "hello", elapsed_ms=1, attempt=1)
    assert bounded_result(result, max_bytes=100) is result


@pytest.mark.parametrize(
    ("size", "cap", "truncated"), [(99, 100, False), (100, 100, False), (101, 100, True)]
)
def test_text_over_the_cap_is_truncated_with_a_marker(size: int, cap: int, truncated: bool) -> None:
    # Given a result of `size` bytes
    result = success_result(CALL, "x" * size, elapsed_ms=1, attempt=1)
    # When it is bounded
    bounded = bounded_result(result, max_bytes=cap)
    # Then only results over the cap are cut, and say so
    assert ("truncated by unstuck" in bounded.text) is truncated
    assert ("truncated_bytes" in bounded.details) is truncated
    if truncated:
        assert bounded.text.startswith("x" * cap)
        assert bounded.details["truncated_bytes"] == size - cap


def test_multibyte_text_is_cut_on_a_character_boundary() -> None:
    result = success_result(CALL, "é" * 100, elapsed_ms=1, attempt=1)
    bounded = bounded_result(result, max_bytes=11)
    assert bounded.text.startswith("é" * 5 + "\n[")


def test_secrets_in_results_are_masked() -> None:
    result = success_result(CALL, "url=redis://app:hunter2@db:6379/0", elapsed_ms=1, attempt=1)
    bounded = bounded_result(result, max_bytes=1000)
    assert "hunter2" not in bounded.text
    assert "redis://app:****@db" in bounded.text


def test_log_filter_masks_the_formatted_message() -> None:
    record = logging.LogRecord(
        "x", logging.WARNING, __file__, 1, "cannot reach %s", ("redis://:pw1@h/0",), None
    )
    assert RedactingFilter().filter(record)
    assert record.getMessage() == "cannot reach redis://:****@h/0"
