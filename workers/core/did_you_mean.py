"""Suggestions ("did you mean") for unknown config keys, at any depth of a pydantic model.

A misspelt key is answered with the closest known name, compared against both the field
names (``history_size``) and their aliases (``historySize``), so a user writing either
spelling gets the one they were near. Pure: reads model classes, never a file or Redis.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from pydantic.alias_generators import to_camel

__all__ = ["closest_key", "known_keys", "model_at", "unknown_key_message"]

_CUTOFF = 0.6


def known_keys(model: type[BaseModel]) -> list[str]:
    """Every spelling ``model`` accepts: field names, their aliases and their camelCase forms."""
    keys: list[str] = []
    generator = model.model_config.get("alias_generator")
    for name, field in model.model_fields.items():
        keys.append(name)
        for alias in (field.alias, field.validation_alias):
            if isinstance(alias, str):
                keys.append(alias)
        if generator is not None:
            keys.append(to_camel(name))
    return list(dict.fromkeys(keys))


def closest_key(key: str, candidates: Sequence[str]) -> str | None:
    """The candidate ``key`` was most likely meant to be, or None when none is close."""
    # Prefer the spelling style the user writes (snake_case or camelCase), then any.
    styled = [c for c in candidates if ("_" in c) == ("_" in key)]
    near = difflib.get_close_matches(key, styled, n=1, cutoff=_CUTOFF) or difflib.get_close_matches(
        key, list(candidates), n=1, cutoff=_CUTOFF
    )
    if not near:
        lowered = {c.lower().replace("_", ""): c for c in candidates}
        return lowered.get(key.lower().replace("_", ""))
    return near[0]


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (``X | None``, ``tuple[X, ...]``, ``dict[str, X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found += _models_in(arg)
    return found


def model_at(root: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model that holds the last key of ``loc`` (list indexes and dict keys skipped)."""
    current: type[BaseModel] | None = root
    for part in loc[:-1]:
        if current is None:
            return None
        field = _field(current, part)
        if field is None:
            continue  # an index or a dict key: stay on the container's item model
        models = _models_in(field)
        current = models[0] if models else None
    return current


def _field(model: type[BaseModel], part: int | str) -> Any:
    if not isinstance(part, str):
        return None
    for name, field in model.model_fields.items():
        if part in (name, field.alias, field.validation_alias, to_camel(name)):
            return field.annotation
    return None


def unknown_key_message(root: type[BaseModel], loc: Sequence[int | str]) -> str:
    """The message for an unknown key, naming the close known key of the same level if any."""
    holder = model_at(root, loc)
    near = closest_key(str(loc[-1]), known_keys(holder)) if holder is not None and loc else None
    return "unknown key" + (f"; did you mean {near!r}?" if near else "")
