"""Read-only passes over the whole ledger for operators: the metrics scrape and ``unstuck up``.

:class:`LedgerScanner` finds call and run records with one ``SCAN`` pass over the tagged keys
of the prefix (``COUNT`` 1000 per step, at most ``max_keys`` keys, classified by
:func:`~workers.store.keys.ledger_key_kind`), then reads them with pipelined ``HMGET``/``HGET``
batches of 500. Every method raises ``StoreError`` when Redis fails; rows are plain values.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from workers.core.models import CallState
from workers.store.connection import store_errors
from workers.store.keys import all_index_keys, ledger_key_kind, ledger_scan_pattern, parse_due_member
from workers.store.ledger import Ledger
from workers.store.records import CALL, RUN, CallField, Row, RunField

__all__ = ["CallRow", "DueSample", "KeyScan", "LedgerScanner", "RunRow", "due_deadlines"]

_CALL_FIELDS: Final = (
    CallField.TOOL, CallField.STATE, CallField.REASON, CallField.STARTED_MS, CallField.FINISHED_MS
)  # fmt: skip
_RUN_FIELDS: Final = (RunField.STATUS, RunField.CLASS, RunField.STREAM_IDLE_N)
_DUE_FIELDS: Final = (CallField.STATE, CallField.SUBMITTED_MS)
_BATCH: Final = 500
_SCAN_COUNT: Final = 1000


@dataclass(frozen=True)
class CallRow:
    """The fields of one call record the metrics need."""

    tool: str
    state: str
    reason: str
    started_ms: int | None
    finished_ms: int | None


@dataclass(frozen=True)
class RunRow:
    """The fields of one run record the metrics need."""

    status: str
    klass: str  # the watchdog's latest class ("" before its first look)
    stream_idles: int


@dataclass(frozen=True)
class KeyScan:
    """The record keys one bounded ``SCAN`` pass found."""

    call_keys: list[str]
    run_keys: list[str]
    keys_read: int
    truncated: bool


@dataclass(frozen=True)
class DueSample:
    """Unanswered calls in the due index, and the earliest submission among a sample of them."""

    pending: int
    oldest_submitted_ms: int | None


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def _batches(keys: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(keys), _BATCH):
        yield keys[start : start + _BATCH]


class LedgerScanner:
    """Bounded reads of every call and run record of one ledger's prefix."""

    def __init__(self, ledger: Ledger, *, max_keys: int = 20_000) -> None:
        self.ledger = ledger
        self.max_keys = max_keys

    def keys(self) -> KeyScan:
        """One ``SCAN`` pass reading at most ``max_keys`` keys (``truncated`` when it stopped early)."""
        call_keys: list[str] = []
        run_keys: list[str] = []
        read, truncated = 0, False
        pattern = ledger_scan_pattern(self.ledger.prefix)
        with store_errors():
            for raw in self.ledger.client.scan_iter(match=pattern, count=_SCAN_COUNT):
                if read >= self.max_keys:
                    truncated = True
                    break
                read += 1
                key = _text(raw)
                kind = ledger_key_kind(key)
                if kind == "call":
                    call_keys.append(key)
                elif kind == "run":
                    run_keys.append(key)
        return KeyScan(call_keys, run_keys, read, truncated)

    def call_rows(self, keys: Sequence[str]) -> Iterator[CallRow]:
        """The rows of ``keys``, read in pipelined batches; records expired since the scan are skipped."""
        for batch in _batches(keys):
            with store_errors():
                pipe = self.ledger.client.pipeline(transaction=False)
                for key in batch:
                    pipe.hmget(key, _CALL_FIELDS)
                replies = pipe.execute()
            for key, reply in zip(batch, replies, strict=True):
                row = Row.zip(CALL, _CALL_FIELDS, reply, where=key)
                state = row.raw(CallField.STATE)
                if state is None:  # expired between SCAN and HMGET
                    continue
                yield CallRow(
                    row.text(CallField.TOOL),
                    state,
                    row.text(CallField.REASON),
                    row.maybe_integer(CallField.STARTED_MS),
                    row.maybe_integer(CallField.FINISHED_MS),
                )

    def run_rows(self, keys: Sequence[str]) -> list[RunRow]:
        """Status, the watchdog's class and idle model streams of each run still present among ``keys``."""
        rows: list[RunRow] = []
        for batch in _batches(keys):
            with store_errors():
                pipe = self.ledger.client.pipeline(transaction=False)
                for key in batch:
                    pipe.hmget(key, _RUN_FIELDS)
                replies = pipe.execute()
            found = (
                Row.zip(RUN, _RUN_FIELDS, reply, where=key) for key, reply in zip(batch, replies, strict=True)
            )
            rows.extend(
                RunRow(
                    row.text(RunField.STATUS), row.text(RunField.CLASS), row.integer(RunField.STREAM_IDLE_N)
                )
                for row in found
                if RunField.STATUS in row
            )
        return rows

    def due_sample(self, sample: int) -> DueSample:
        """The due index's size, and the earliest submission among its ``sample`` nearest deadlines.

        The index is scored by deadline, not by submission time, so a call submitted earlier
        with a later deadline can be missed.
        """
        prefix = self.ledger.prefix
        with store_errors():
            pipe = self.ledger.client.pipeline(transaction=False)
            for index in all_index_keys(prefix):
                pipe.zcard(index.due)
                pipe.zrange(index.due, 0, sample - 1, withscores=True)
            replies = pipe.execute()
            pending = sum(int(n) for n in replies[0::2])
            nearest = sorted((row for rows in replies[1::2] for row in rows), key=lambda row: row[1])
            members = [_text(m) for m, _ in nearest[:sample]]
            pipe = self.ledger.client.pipeline(transaction=False)
            for member in members:
                keys, call_id = parse_due_member(prefix, member)
                pipe.hmget(keys.call(call_id), _DUE_FIELDS)
            replies = pipe.execute()
        rows = [Row.zip(CALL, _DUE_FIELDS, reply) for reply in replies]
        # A submission time missing or malformed is left out, not taken as the oldest.
        submitted = [
            row.maybe_integer(CallField.SUBMITTED_MS)
            for row in rows
            if row.raw(CallField.STATE) not in (None, CallState.DONE)
        ]
        return DueSample(pending, min((s for s in submitted if s is not None), default=None))


def due_deadlines(ledger: Ledger) -> dict[str, int]:
    """Every member of the due index with its deadline (ms); raises ``StoreError``."""
    with store_errors():
        pipe = ledger.client.pipeline(transaction=False)
        for index in all_index_keys(ledger.prefix):
            pipe.zrange(index.due, 0, -1, withscores=True)
        rows: list[Any] = [row for bucket in pipe.execute() for row in bucket]
    return {str(member): int(score) for member, score in rows}
