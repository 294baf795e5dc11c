"""Hostile messages: pickle is refused by the app's settings; forged bodies never run a tool."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from kombu.exceptions import ContentDisallowed
from kombu.serialization import dumps, loads, prepare_accept_content
from pydantic import ValidationError

from workers.celery_edge.app import create_app
from workers.core.models import CallJob
from workers.core.tool_policy import BUILTIN_TOOLS
from workers.errors import ToolNotFound
from workers.settings import Settings
from workers.tools.builtins import enable_builtins
from workers.tools.registry import get_tool, registered_tools


@pytest.fixture(autouse=True)
def _builtins_enabled() -> Iterator[None]:
    # Built-ins are opt-in (tools.builtins); these tests use them through the registry.
    enable_builtins(BUILTIN_TOOLS)
    yield
    enable_builtins(())


_UNPICKLED: list[str] = []


def _record_unpickle() -> str:
    _UNPICKLED.append("ran")
    return "payload"


class _Payload:
    """Unpickling this object calls code: exactly what a forged pickle message would do."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _record_unpickle, ()


@pytest.fixture(scope="module")
def app() -> Celery:
    return create_app(Settings(redis={"url": "redis://127.0.0.1:1/0"}), role="client")


def _accepted(app: Celery) -> set[str]:
    # What Celery's consumer does with accept_content: names become content types.
    return prepare_accept_content(app.conf.accept_content) or set()


def test_only_json_is_accepted_and_produced(app: Celery) -> None:
    assert app.conf.accept_content == ["json"]
    assert app.conf.result_accept_content == ["json"]
    assert app.conf.task_serializer == "json"
    assert app.conf.result_serializer == "json"


@pytest.mark.parametrize("serializer", ["pickle", "yaml", "msgpack"])
def test_a_non_json_body_is_refused_before_decoding(app: Celery, serializer: str) -> None:
    # Given a message body in another serializer (pickle would run code on load)
    if serializer == "pickle":
        content_type, encoding, body = "application/x-python-serialize", "binary", pickle.dumps(_Payload())
    else:
        content_type, encoding, body = f"application/x-{serializer}", "utf-8", b"{}"
    # When kombu decodes it with the app's accept list / Then it is refused and nothing ran
    with pytest.raises(ContentDisallowed):
        loads(body, content_type, encoding, accept=_accepted(app))
    assert _UNPICKLED == []


def test_a_json_body_still_decodes(app: Celery) -> None:
    content_type, encoding, body = dumps({"a": 1}, serializer="json")
    assert loads(body, content_type, encoding, accept=_accepted(app)) == {"a": 1}


_JOB: dict[str, Any] = {
    "session_key": "s1",
    "run_id": "r1",
    "call": {"id": "c1", "name": "exec", "arguments": {"command": "true"}},
    "submitted_ms": 1,
    "deadline_ms": 2,
    "soft_s": 1.0,
    "hard_s": 2.0,
}


@pytest.mark.parametrize(
    "forged",
    [
        {**_JOB, "__reduce__": "os.system"},
        {**_JOB, "task": "celery.backend_cleanup"},
        {k: v for k, v in _JOB.items() if k != "call"},
        {k: v for k, v in _JOB.items() if k != "deadline_ms"},
        {**_JOB, "call": "exec('true')"},
        {**_JOB, "soft_s": 0},
        {**_JOB, "session_key": ""},
        {**_JOB, "call": {**_JOB["call"], "name": ""}},
        [],
        "exec",
    ],
)
def test_a_forged_invoke_body_is_refused(forged: Any) -> None:
    with pytest.raises(ValidationError):
        CallJob.model_validate(forged)


def test_an_extra_field_inside_the_call_is_dropped_not_kept() -> None:
    # ToolCall ignores unknown keys (model output often carries some); nothing may reach the tool.
    job = CallJob.model_validate({**_JOB, "call": {**_JOB["call"], "module": "os"}})
    assert job.call.model_dump() == _JOB["call"]


def test_the_genuine_body_decodes() -> None:
    assert CallJob.model_validate(_JOB).call.name == "exec"


def test_an_unregistered_tool_name_is_tool_not_found() -> None:
    # Given a well-formed body naming a tool nobody registered
    job = CallJob.model_validate({**_JOB, "call": {"id": "c1", "name": "exce"}})
    assert job.call.name not in registered_tools()
    # When it is looked up / Then ToolNotFound names the closest registered tool
    with pytest.raises(ToolNotFound) as caught:
        get_tool(job.call.name)
    assert "exec" in caught.value.closest


@pytest.mark.parametrize("name", ["os.system", "__import__", "builtins.eval", "../exec"])
def test_a_dotted_or_dunder_name_is_never_resolved_as_code(name: str) -> None:
    with pytest.raises(ToolNotFound):
        get_tool(name)
