"""The invoke message's ``kwargsrepr`` is built as Celery's ``saferepr`` builds it (messages.kwargs_repr)."""

from __future__ import annotations

import json
import pickle
from typing import Any

from celery.utils.saferepr import saferepr
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu.utils import json as kombu_json

from workers.celery_edge.messages import Shown, kwargs_repr, shown

MAXLEN, LEVELS = 1024, 3

_leaves = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30)
_json = st.recursive(
    _leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(max_size=8), _json, max_size=5))
def test_kwargs_repr_is_saferepr_or_none(kwargs: dict[str, Any]) -> None:
    # Given JSON-like keyword arguments (quotes, backslashes, newlines, nesting past 3 levels)
    ours = kwargs_repr(kwargs, MAXLEN, LEVELS)
    # Then the text is saferepr's, or None where saferepr would cut it
    if ours is None:
        assert len(saferepr(kwargs, MAXLEN, maxlevels=LEVELS)) >= MAXLEN - 3
    else:
        assert ours == saferepr(kwargs, MAXLEN, maxlevels=LEVELS)


def test_a_job_is_shown_to_its_fourth_level_and_others_are_left_to_saferepr() -> None:
    job = {"call": {"id": "c'1", "name": "noop", "arguments": {"text": "x\ny"}}, "soft_s": 1.5, "on": True}
    assert kwargs_repr({"job": job}, MAXLEN, LEVELS) == saferepr({"job": job}, MAXLEN, maxlevels=LEVELS)
    assert kwargs_repr({"job": job}, MAXLEN, LEVELS) == (
        "{'job': {'call': {'id': 'c\\'1', 'name': 'noop', 'arguments': {...}}, 'soft_s': 1.5, 'on': True}}"
    )
    assert kwargs_repr({"job": ("a", "tuple")}, MAXLEN, LEVELS) is None
    assert kwargs_repr({"job": "x" * MAXLEN}, MAXLEN, LEVELS) is None


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=8), _json, max_size=5))
def test_a_shown_value_is_shown_by_celery_as_the_value_itself(value: dict[str, Any]) -> None:
    # What Celery's success line and task-succeeded event show of the invoke task's return value
    assert saferepr(shown(value, MAXLEN, LEVELS), MAXLEN, maxlevels=LEVELS) == saferepr(
        value, MAXLEN, maxlevels=LEVELS
    )


def test_the_invoke_tasks_summary_is_pre_rendered_and_stored_as_itself() -> None:
    info = {"outcome": "ok", "reason": None, "elapsed_ms": 3, "attempt": 1}
    value = shown(info, MAXLEN, LEVELS)
    assert isinstance(value, Shown)
    # Where a result backend stores it (JSON, or the signed serializer around it) or a pipe
    # carries it (pickle), it is the summary itself
    assert json.loads(kombu_json.dumps(value)) == info
    assert pickle.loads(pickle.dumps(value)) == info
