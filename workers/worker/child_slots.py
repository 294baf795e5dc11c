"""Which job each pool child runs, in memory the worker's main process shares with its children.

The lease keeper in the main process watches the calls the pool children run: it renews their
leases, answers a dead child's call and stops a silent or cancelled tool. Celery keeps no
public list of the tasks a worker runs, so each child says it itself: it writes the job it took
into its slot before it claims the call, and clears the slot before its task ends. The keeper
thus sees a call from before its claim until its task is over, and never a finished call on a
child that already runs the next one.

The table is an anonymous shared mapping the main process makes before the pool forks; a child
writes only the slot of its pool index. Each write is bracketed by the slot's generation
(odd while writing), so the main process never takes half a write: it reads again, and skips a
slot that stays torn. That can only be a child killed while writing its slot, before its claim
or after its answer, so it holds no call to answer.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["ChildSlots", "HeldJob", "HeldJobs", "holding", "install_child_slots", "set_child_index"]

_HEADER = struct.Struct("<QqI")  # generation, pid, length of the job's JSON
_JOB_SLACK_BYTES = 64 * 1024  # room for the job beside its arguments: ids, names, limits
_READS = 3  # attempts at reading a slot a child is writing at that moment


@dataclass(frozen=True)
class HeldJob:
    """The job in one slot: the pool child's index and pid, and the task's keyword arguments."""

    index: int
    generation: int
    pid: int
    kwargs: dict[str, Any]


class ChildSlots:
    """One slot per pool process: the JSON of the job it runs (empty while it waits)."""

    def __init__(self, count: int, *, max_argument_bytes: int) -> None:
        self._count = count
        self._capacity = max_argument_bytes + _JOB_SLACK_BYTES
        self._size = _HEADER.size + self._capacity
        self._map = mmap.mmap(-1, count * self._size)  # anonymous and shared: forked children see it

    def occupy(self, index: int, job: dict[str, Any], encoded: bytes | None = None) -> None:
        """Write ``job`` into slot ``index`` as the job of this process (a pool child).

        ``encoded``: ``job`` as JSON already (the digest's serialisation), written as it is
        when it fits.
        """
        if encoded is None or len(encoded) > self._capacity:
            encoded = _job_bytes(job, self._capacity)
        self._write(index, os.getpid(), encoded)

    def vacate(self, index: int) -> None:
        """Empty slot ``index``: its child runs nothing."""
        self._write(index, 0, b"")

    def held(self) -> list[HeldJob]:
        """The jobs the slots hold now (a slot being written is read again, then skipped)."""
        jobs = []
        for index in range(self._count):
            read = self._read(index)
            if read is not None:
                jobs.append(read)
        return jobs

    def _write(self, index: int, pid: int, data: bytes) -> None:
        offset = self._offset(index)
        (generation,) = struct.unpack_from("<Q", self._map, offset)
        generation |= 1  # odd: being written (a write a killed child left half done is odd too)
        struct.pack_into("<Q", self._map, offset, generation)
        struct.pack_into("<qI", self._map, offset + 8, pid, len(data))
        start = offset + _HEADER.size
        self._map[start : start + len(data)] = data
        struct.pack_into("<Q", self._map, offset, generation + 1)

    def _read(self, index: int) -> HeldJob | None:
        offset = self._offset(index)
        for _ in range(_READS):
            generation, pid, length = _HEADER.unpack_from(self._map, offset)
            if generation % 2:
                continue  # its child is writing it right now
            if not pid:
                return None
            start = offset + _HEADER.size
            data = self._map[start : start + min(length, self._capacity)]
            if struct.unpack_from("<Q", self._map, offset)[0] == generation:
                return _held(index, generation, pid, data)
        return None

    def _offset(self, index: int) -> int:
        if not 0 <= index < self._count:
            raise IndexError(f"pool slot {index} of {self._count}")
        return index * self._size


def _held(index: int, generation: int, pid: int, data: bytes) -> HeldJob | None:
    try:
        job = json.loads(data)
    except ValueError:
        return None  # not a job a child wrote whole: nothing the keeper could answer
    return HeldJob(index, generation, pid, {"job": job})


def _job_bytes(job: dict[str, Any], capacity: int) -> bytes:
    """The job as JSON: without its arguments past the slot's room (the main process reads none)."""
    data = json.dumps(job, separators=(",", ":")).encode()
    if len(data) <= capacity:
        return data
    call = job.get("call")
    trimmed = {**job, "call": {**call, "arguments": {}}} if isinstance(call, dict) else {}
    data = json.dumps(trimmed, separators=(",", ":")).encode()
    return data if len(data) <= capacity else b"{}"


class HeldJobs:
    """The keyword arguments of the jobs the lease keeper watches, from the slots (main process).

    A slot whose child died keeps its job until a new child of that index takes one; it is
    handed on at the first tick that finds the child dead (the keeper answers its call, if
    nobody did), then left out, so no later tick signals a pid that may belong to another
    process by then.
    """

    def __init__(self, slots: ChildSlots, *, alive: Callable[[int], bool]) -> None:
        self._slots = slots
        self._alive = alive
        self._dead: set[tuple[int, int]] = set()  # (index, generation) of slots of dead children

    def running(self) -> list[dict[str, Any]]:
        """The task keyword arguments (``{"job": ...}``) of every job a slot holds now."""
        jobs, dead = [], set()
        for held in self._slots.held():
            if not self._alive(held.pid):
                dead.add((held.index, held.generation))
                if (held.index, held.generation) in self._dead:
                    continue
            jobs.append(held.kwargs)
        self._dead = dead
        return jobs


# The worker's table (main process, before the pool forks) and this pool child's index in it.
_slots: ChildSlots | None = None
_index: int | None = None


def install_child_slots(count: int, *, max_argument_bytes: int) -> ChildSlots:
    """Make the table of ``count`` slots, before the pool forks (the worker's main process)."""
    global _slots
    _slots = ChildSlots(count, max_argument_bytes=max_argument_bytes)
    return _slots


def set_child_index(index: int | None) -> None:
    """Tell a freshly started pool child its index in the pool (its slot)."""
    global _index
    _index = index


@contextlib.contextmanager
def holding(job: dict[str, Any], encoded: bytes | None = None) -> Iterator[None]:
    """This pool child runs ``job`` inside the block: its slot holds the job until the block ends.

    ``encoded``: ``job`` as JSON, when the caller has serialised it already.
    """
    slots, index = _slots, _index
    if slots is None or index is None:
        yield  # no worker table: a call run outside a worker's pool (tests, a local run)
        return
    slots.occupy(index, job, encoded)  # an index past the table raises: its calls would go unwatched
    try:
        yield
    finally:
        slots.vacate(index)
