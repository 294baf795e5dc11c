"""Reading a hash by field name: :class:`Row` applies each field's declared default.

A reader asks for the fields it needs by their :mod:`workers.store.records` names (``HMGET``
of a declared list, zipped back with :meth:`Row.zip`, or ``HGETALL`` into :class:`Row`) and
reads each with its type. A missing field gets the default its declaration names, or raises
``StoreError`` when the declaration says it is required; it never silently becomes 0.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

from workers.errors import StoreError
from workers.store.records import REQUIRED, HashRecord

__all__ = ["Row", "reply_member"]

F = TypeVar("F", bound=enum.StrEnum)
E = TypeVar("E", bound=enum.StrEnum)

_Raw = str | bytes | int | float | None


def _decode(value: _Raw) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class Row(Generic[F]):
    """One hash as read, by field name; each typed read applies the field's declared default."""

    __slots__ = ("_values", "record", "where")

    def __init__(self, record: HashRecord[F], values: Mapping[Any, _Raw], *, where: str = "") -> None:
        self.record = record
        self.where = where or f"a {record.name} record"
        self._values = {
            str(_decode(k)): v for k, value in values.items() if (v := _decode(value)) is not None
        }

    @classmethod
    def zip(
        cls, record: HashRecord[F], names: Sequence[F], reply: Sequence[_Raw], *, where: str = ""
    ) -> Row[F]:
        """The row of an ``HMGET`` of ``names`` (missing fields come back as None)."""
        return cls(record, dict(zip(names, reply, strict=True)), where=where)

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def __bool__(self) -> bool:
        return bool(self._values)

    def raw(self, name: F) -> str | None:
        """The stored text of a field, None when missing (no default applied)."""
        return self._values.get(name)

    def text(self, name: F) -> str:
        """A field as text; missing: its declared default."""
        value = self._values.get(name)
        return value if value is not None else self._default(name, str)

    def integer(self, name: F) -> int:
        """A number field; missing or malformed: its declared default."""
        value = self.maybe_integer(name)
        return value if value is not None else self._default(name, int)

    def maybe_integer(self, name: F) -> int | None:
        """A number field, None when missing or malformed (for readers to whom absence is news)."""
        try:
            return int(self._values[name])
        except (KeyError, ValueError):
            return None

    def flag(self, name: F) -> bool:
        """A ``"1"``/``"0"`` field; missing: its declared default."""
        value = self._values.get(name)
        return value == "1" if value is not None else bool(self._default(name, int))

    def member(self, name: F, values: type[E]) -> E:
        """An enum field; missing: its declared default; a value outside ``values`` is a ``StoreError``."""
        value = self._values.get(name)
        try:
            return values(value if value is not None else self._default(name, str))
        except ValueError:
            raise StoreError(f"{self.where}: {name} holds {value!r}, not a {values.__name__}") from None

    def _default(self, name: F, kind: type[int] | type[str]) -> Any:
        default = self.record.fields[name].default
        if default is REQUIRED:
            raise StoreError(f"{self.where}: the {self.record.name} record has no valid {name}")
        if not isinstance(default, kind):
            raise TypeError(f"{self.record.name}.{name} is not read as {kind.__name__}")
        return default


def reply_member(values: type[E], raw: _Raw, *, where: str) -> E:
    """A state a script returned, as its enum; any other value is a ``StoreError``."""
    try:
        return values(_decode(raw) or "")
    except ValueError:
        raise StoreError(f"{where} returned {raw!r}, not a {values.__name__}") from None
