"""The pool children's slots: the main process sees each child's job from before its claim to its end.

The slots are shared memory between processes, so the writes here come from real forked
children as well as from this process.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import pytest

from workers.core.job_digest import canonical_json
from workers.worker import child_slots
from workers.worker.child_slots import ChildSlots, HeldJobs, holding


def _job(call_id: str = "c1", arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    call = {"id": call_id, "name": "echo", "arguments": arguments or {"text": "hi"}}
    return {"session_key": "s1", "run_id": "r1", "call": call, "submitted_ms": 1, "deadline_ms": 2}


def _in_child(action: Any) -> int:
    """Run ``action`` in a forked child that then exits at once; its pid."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            action()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_a_job_a_child_writes_is_seen_by_the_process_that_forked_it() -> None:
    # Given slots made before the fork
    slots = ChildSlots(2, max_argument_bytes=1024)
    # When a child writes its job into slot 1
    pid = _in_child(lambda: slots.occupy(1, _job("c-child")))
    # Then the parent reads it, with the child's pid
    (held,) = slots.held()
    assert (held.index, held.pid, held.kwargs) == (1, pid, {"job": _job("c-child")})


def test_a_vacated_slot_holds_nothing_and_a_slot_is_reused() -> None:
    slots = ChildSlots(1, max_argument_bytes=1024)
    slots.occupy(0, _job("c1"))
    first = slots.held()[0].generation
    slots.vacate(0)
    assert slots.held() == []
    slots.occupy(0, _job("c2"))
    (held,) = slots.held()
    assert held.kwargs["job"]["call"]["id"] == "c2"
    assert held.generation > first  # a new write is a new generation


def test_a_slot_left_half_written_is_skipped() -> None:
    # Given a slot whose child was killed between the two halves of its write (odd generation)
    slots = ChildSlots(2, max_argument_bytes=1024)
    slots.occupy(0, _job("c-torn"))
    slots.occupy(1, _job("c-whole"))
    mapping = slots._map  # the test plays the killed writer
    (generation,) = struct.unpack_from("<Q", mapping, 0)
    struct.pack_into("<Q", mapping, 0, generation + 1)
    # Then only the whole slot is read
    assert [held.kwargs["job"]["call"]["id"] for held in slots.held()] == ["c-whole"]


def test_arguments_past_the_slots_room_are_left_out_and_the_rest_kept() -> None:
    slots = ChildSlots(1, max_argument_bytes=16)
    job = _job("c-big", {"text": "x" * 200_000})
    slots.occupy(0, job)
    (held,) = slots.held()
    assert held.kwargs["job"] == {**job, "call": {**job["call"], "arguments": {}}}


def test_a_job_serialised_already_is_written_as_it_is() -> None:
    # Given the job as the digest serialised it (sorted keys, another spelling than the slot's own)
    slots = ChildSlots(1, max_argument_bytes=1024)
    job = _job("c-canonical")
    encoded = canonical_json(job).encode()
    # When the child writes its slot with those bytes
    slots.occupy(0, job, encoded)
    # Then the slot holds exactly them, and the main process reads the same job
    header = struct.calcsize("<QqI")
    assert bytes(slots._map[header : header + len(encoded)]) == encoded
    assert slots.held()[0].kwargs == {"job": job}


def test_a_serialised_job_past_the_slots_room_is_trimmed_like_any_other() -> None:
    slots = ChildSlots(1, max_argument_bytes=16)
    job = _job("c-big", {"text": "x" * 200_000})
    slots.occupy(0, job, canonical_json(job).encode())
    (held,) = slots.held()
    assert held.kwargs["job"] == {**job, "call": {**job["call"], "arguments": {}}}


def test_a_slot_past_the_table_is_refused() -> None:
    with pytest.raises(IndexError, match="pool slot 2 of 2"):
        ChildSlots(2, max_argument_bytes=16).occupy(2, _job())


def test_a_dead_childs_job_is_handed_on_once_and_its_next_job_again() -> None:
    # Given a slot written by a child that has exited since
    slots = ChildSlots(1, max_argument_bytes=1024)
    dead = _in_child(lambda: slots.occupy(0, _job("c-lost")))
    held = HeldJobs(slots, alive=lambda pid: pid != dead)
    # Then the first tick hands its job on (its call may need answering), later ticks do not
    assert [job["job"]["call"]["id"] for job in held.running()] == ["c-lost"]
    assert held.running() == []
    assert held.running() == []
    # And a new child of that index, with a job of its own, is watched again
    slots.occupy(0, _job("c-next"))
    assert [job["job"]["call"]["id"] for job in held.running()] == ["c-next"]
    assert [job["job"]["call"]["id"] for job in held.running()] == ["c-next"]


def test_holding_fills_the_childs_slot_for_the_block_only_even_when_it_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slots = ChildSlots(3, max_argument_bytes=1024)
    monkeypatch.setattr(child_slots, "_slots", slots)
    monkeypatch.setattr(child_slots, "_index", 2)
    with holding(_job("c-in")):
        assert [(h.index, h.pid) for h in slots.held()] == [(2, os.getpid())]
    assert slots.held() == []
    with pytest.raises(RuntimeError), holding(_job("c-raises")):
        raise RuntimeError("the task failed")
    assert slots.held() == []


def test_holding_outside_a_workers_pool_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(child_slots, "_slots", None)
    monkeypatch.setattr(child_slots, "_index", None)
    with holding(_job()):
        pass  # nothing to write to: a call run outside a worker's pool


def test_a_slot_whose_bytes_are_not_a_job_is_skipped() -> None:
    slots = ChildSlots(1, max_argument_bytes=1024)
    slots.occupy(0, _job())
    slots._map[struct.calcsize("<QqI")] = ord("#")  # the JSON's first byte, overwritten
    assert slots.held() == []
