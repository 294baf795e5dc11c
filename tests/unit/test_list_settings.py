"""Every list-valued setting reads both ways users write lists: ``a,b`` and ``["a","b"]``.

The list settings are found by walking the ``Settings`` model (nested models, ``dict`` entries,
list entries), so a list added later is held to the same rule without touching this file. Each
is set through the environment exactly as a user would; a value that looks like JSON but is not
is refused at start-up, naming the variable.
"""

from __future__ import annotations

import json
import os
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, SecretStr, TypeAdapter, ValidationError

from workers.core.failure_policy import BRANCH_REASONS, FALLBACK_REASONS
from workers.core.tool_policy import BUILTIN_TOOLS
from workers.errors import ConfigError
from workers.settings import Settings, load_settings

#: Where a walk steps into a ``dict`` entry (a tool's own block) or a list entry.
_KEY = "probe_tool"
_INDEX = 0
_REASONS = sorted(str(reason.value) for reason in FALLBACK_REASONS & BRANCH_REASONS)
#: Item pairs tried in turn until one is valid for the setting (its own validators decide).
_ITEM_PAIRS: tuple[tuple[str, str], ...] = (
    ("alpha", "beta"),
    (BUILTIN_TOOLS[0], BUILTIN_TOOLS[1]),
    (_REASONS[0], _REASONS[1]),
)
_SCALARS: tuple[Any, ...] = (1, "x")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("UNSTUCK_"):
            monkeypatch.delenv(name)


@dataclass(frozen=True)
class ListSetting:
    """One list-valued field, where it sits, and what its siblings on the way need."""

    path: tuple[str | int, ...]  # attribute names, dict keys (_KEY) and list indexes (_INDEX)
    owner: type[BaseModel]
    name: str
    item: Any
    required: dict[tuple[str | int, ...], dict[str, Any]]  # entry path -> its required fields

    def __str__(self) -> str:
        return ".".join(str(p) for p in self.path)

    @property
    def of_models(self) -> bool:
        return isinstance(self.item, type) and issubclass(self.item, BaseModel)


def _unwrap(annotation: Any) -> Any:
    """The annotation without ``Annotated`` and without ``None`` in an optional."""
    if typing.get_origin(annotation) is Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, type(int | None)) and len(args) == 1:
        return _unwrap(args[0])
    return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _required(model: type[BaseModel], skip: str) -> dict[str, Any]:
    """Valid values for the fields ``model`` cannot do without, other than ``skip``."""
    values: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if name == skip or not field.is_required():
            continue
        adapter: TypeAdapter[Any] = TypeAdapter(typing.cast(Any, Annotated)[field.annotation, field])
        values[name] = next(v for v in _SCALARS if _accepts(adapter, v))
    return values


def _accepts(adapter: TypeAdapter[Any], value: Any) -> bool:
    try:
        adapter.validate_python(value)
    except ValidationError:
        return False
    return True


def list_settings(
    model: type[BaseModel] = Settings,
    path: tuple[str | int, ...] = (),
    required: dict[tuple[str | int, ...], dict[str, Any]] | None = None,
) -> Iterator[ListSetting]:
    """Every list-valued field under ``model``, at any depth."""
    required = required or {}
    for name, field in model.model_fields.items():
        annotation = _unwrap(field.annotation)
        origin = typing.get_origin(annotation)
        here = (*path, name)
        if origin in (tuple, list):
            item = _unwrap(typing.get_args(annotation)[0])
            yield ListSetting(here, model, name, item, required)
            if _is_model(item):
                entry = (*here, _INDEX)
                yield from list_settings(item, entry, {**required, entry: {}})
        elif origin is dict and _is_model(_unwrap(typing.get_args(annotation)[1])):
            entry = (*here, _KEY)
            yield from list_settings(_unwrap(typing.get_args(annotation)[1]), entry, {**required, entry: {}})
        elif _is_model(annotation):
            yield from list_settings(annotation, here, required)


def _items(setting: ListSetting) -> tuple[str, str]:
    """Two items the setting's own model accepts (its validators, not only its type)."""
    siblings = _required(setting.owner, setting.name)
    for pair in _ITEM_PAIRS:
        try:
            setting.owner.model_validate({**siblings, setting.name: list(pair)})
        except ValidationError:
            continue
        return pair
    raise AssertionError(f"no item pair in _ITEM_PAIRS is valid for {setting}: add one")


def _environment(setting: ListSetting, text: str) -> dict[str, str]:
    """The variables that set ``setting`` to ``text``, as a user writes them."""
    list_at = next((i for i, p in enumerate(setting.path) if p == _INDEX), None)
    if list_at is not None:  # inside a list of objects: the list's variable holds them as JSON
        entry_model = _entry_model(setting.path[:list_at])
        entry = {**_required(entry_model, setting.name), setting.name: text}
        return {_variable(setting.path[:list_at]): json.dumps([entry])}
    env = {_variable(setting.path): text}
    for at, part in enumerate(setting.path[:-1]):
        if part == _KEY:  # a dict entry (a tool's block) needs its required fields beside the list
            where = setting.path[: at + 1]
            for name, value in _required(_entry_model(where), str(setting.path[at + 1])).items():
                env[_variable((*where, name))] = str(value)
    return env


def _entry_model(path: tuple[str | int, ...]) -> type[BaseModel]:
    """The model that a dict entry (``_KEY``) or a list ends in."""
    model: Any = Settings
    for part in path:
        if part == _KEY:
            continue
        annotation = _unwrap(model.model_fields[part].annotation)
        origin = typing.get_origin(annotation)
        if origin is dict:
            model = _unwrap(typing.get_args(annotation)[1])
        elif origin in (tuple, list):
            model = _unwrap(typing.get_args(annotation)[0])
        else:
            model = annotation
    return typing.cast(type[BaseModel], model)


def _variable(path: tuple[str | int, ...]) -> str:
    return "UNSTUCK_" + "__".join(str(p).upper() for p in path)


def _value(settings: Settings, path: tuple[str | int, ...]) -> Any:
    found: Any = settings
    for part in path:
        if isinstance(part, int):
            found = found[part]
        elif part == _KEY:
            found = found[_KEY]
        else:
            found = getattr(found, part)
    return found


def _plain(values: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(v.get_secret_value() if isinstance(v, SecretStr) else v for v in values)


def _load(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Settings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return load_settings()


LIST_SETTINGS = list(list_settings())
SCALAR_LISTS = [s for s in LIST_SETTINGS if not s.of_models]


def test_the_walk_finds_list_settings_at_every_depth() -> None:
    # The walk must not come back empty-handed: these sit at the top, nested, in dict and list entries
    found = {str(s) for s in LIST_SETTINGS}
    assert {
        "tool_modules",
        "api.tokens",
        "tools.allow",
        f"tools.retry.{_KEY}.errors",
        f"tools.fallbacks.{_KEY}.reasons",
        "agents.list",
        f"agents.list.{_INDEX}.tool_allow",
    } <= found


@pytest.mark.parametrize("written", ["{a}, {b}", "{a},{b},", '["{a}", "{b}"]', ' [ "{a}" ,"{b}" ] '])
@pytest.mark.parametrize("setting", SCALAR_LISTS, ids=str)
def test_list_setting_reads_the_comma_and_the_json_form(
    monkeypatch: pytest.MonkeyPatch, setting: ListSetting, written: str
) -> None:
    # Given two items the setting accepts, written as a user writes a list
    a, b = _items(setting)
    # When the setting is read from the environment
    settings = _load(monkeypatch, _environment(setting, written.format(a=a, b=b)))
    # Then it holds exactly those two items
    assert _plain(_value(settings, setting.path)) == (a, b)


@pytest.mark.parametrize(
    "written", ['["{a}", ', '["{a}" "{b}"]', "[{a}, {b}]", '{{"{a}": 1}}', '["{a}", " "]']
)
@pytest.mark.parametrize("setting", LIST_SETTINGS, ids=str)
def test_json_looking_list_setting_that_is_not_a_json_list_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, setting: ListSetting, written: str
) -> None:
    # Given a value that starts like JSON but is malformed, not a list, or holds a blank entry
    a, b = ("alpha", "beta") if setting.of_models else _items(setting)
    env = _environment(setting, written.format(a=a, b=b))
    # When the settings are loaded (start-up) / Then they are refused, naming the variable
    with pytest.raises(ConfigError) as info:
        _load(monkeypatch, env)
    variable = _variable(
        setting.path[: setting.path.index(_INDEX)] if _INDEX in setting.path else setting.path
    )
    assert any(f"({variable})" in where and "JSON" in why for where, why in info.value.problems), (
        info.value.problems
    )


@pytest.mark.parametrize("setting", [s for s in LIST_SETTINGS if s.of_models], ids=str)
def test_list_of_objects_reads_the_json_form(monkeypatch: pytest.MonkeyPatch, setting: ListSetting) -> None:
    # Objects have no comma form: the JSON list is how they are written
    entry = _required(typing.cast(type[BaseModel], setting.item), "")
    settings = _load(monkeypatch, {_variable(setting.path): json.dumps([entry])})
    assert len(_value(settings, setting.path)) == 1


def test_tokens_written_as_a_json_list_admit_each_token(monkeypatch: pytest.MonkeyPatch) -> None:
    # The shape users reported: a JSON list became one token spelled with its brackets and quotes
    monkeypatch.setenv("UNSTUCK_API__TOKENS", '["a","b"]')
    assert _plain(load_settings().api.tokens) == ("a", "b")


def test_the_refusal_does_not_quote_the_value_back(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tokens are secrets: the error names the variable and the fault, not what was written
    monkeypatch.setenv("UNSTUCK_API__TOKENS", '["s3cret-token", ')
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "UNSTUCK_API__TOKENS" in str(info.value)
    assert "s3cret-token" not in str(info.value)
