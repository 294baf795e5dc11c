"""Per-call memory limits: where a limit comes from, what a call past it is told, how it is enforced.

The guard's tests run in this process: the rlimit ones everywhere, the cgroup ones where
this process may create a memory cgroup (root on a host with cgroup v1's memory
controller or a delegated v2 subtree); each uses cgroup names of its own pid.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from workers.core.memory_limits import (
    MIB,
    OomCause,
    data_rlimit_bytes,
    lost_child_reason,
    out_of_memory_result,
    resolve_memory_limit_mb,
)
from workers.core.models import SyntheticReason, ToolCall
from workers.core.outcome import CALL_FAILURES, outcome_of
from workers.settings import load_settings
from workers.worker.memory_cgroups import CgroupLayout, MemoryCgroups, find_layout
from workers.worker.memory_guard import MemoryGuard

CALL = ToolCall(id="c1", name="load_table", arguments={})


# --- where the limit comes from ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("configured", "declared", "default", "expected"),
    [
        ({}, None, 1024, 1024),  # the default
        ({}, 256, 1024, 256),  # the tool's own wins over the default
        ({"load_table": 128}, 256, 1024, 128),  # config per tool wins over both
        ({"load_table": 0}, 256, 1024, None),  # 0 in config lifts the tool's own
        ({}, 0, 1024, None),  # a tool may declare none
        ({}, None, 0, None),  # and the default may be none
        ({"other": 64}, None, 1024, 1024),  # another tool's entry changes nothing
    ],
)
def test_limit_is_config_per_tool_then_the_tools_own_then_the_default(
    configured: dict[str, int], declared: int | None, default: int, expected: int | None
) -> None:
    assert (
        resolve_memory_limit_mb("load_table", configured=configured, declared=declared, default=default)
        == expected
    )


def test_environment_and_config_file_set_the_default_and_per_tool_limits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given the default from the environment and per-tool limits from a reference-shaped file
    for name in [n for n in os.environ if n.startswith("UNSTUCK_")]:
        monkeypatch.delenv(name)
    config = tmp_path / "openclaw.json"
    config.write_text("{tools: {memoryLimits: {exec: 512, http_fetch: 0}}}", encoding="utf-8")
    monkeypatch.setenv("UNSTUCK_LIMITS__MEMORY_LIMIT_MB", "300")
    monkeypatch.setenv("UNSTUCK_CONFIG", str(config))
    # When
    settings = load_settings()
    # Then
    assert settings.limits.memory_limit_mb == 300
    assert settings.tools.memory_limits_mb == {"exec": 512, "http_fetch": 0}


def test_environment_sets_per_tool_limits_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNSTUCK_TOOLS__MEMORY_LIMITS_MB", '{"exec": 64}')
    assert load_settings().tools.memory_limits_mb == {"exec": 64}


@pytest.mark.parametrize("value", ["-1", "1.5", "lots"])
def test_a_bad_default_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("UNSTUCK_LIMITS__MEMORY_LIMIT_MB", value)
    with pytest.raises(Exception, match="UNSTUCK_LIMITS__MEMORY_LIMIT_MB"):
        load_settings()


# --- what the model is told -------------------------------------------------------------------


@pytest.mark.parametrize("cause", list(OomCause))
def test_out_of_memory_names_the_limit_and_says_what_to_do(cause: OomCause) -> None:
    result = out_of_memory_result(CALL, limit_mb=256, cause=cause, elapsed_ms=12, attempt=1)
    assert result.reason == "out_of_memory"
    assert result.is_error
    assert result.synthetic
    assert "Tool 'load_table'" in result.text
    assert "256 MB" in result.text
    assert "Ask for less" in result.text
    assert "page through a large file" in result.text
    assert result.details["memory_limit_mb"] == 256
    assert result.details["oom"] == cause.value


def test_what_the_tool_returned_after_a_kill_is_kept_and_shown() -> None:
    partial = '{"exit_code": -9, "stderr": "Killed"}'
    result = out_of_memory_result(
        CALL, limit_mb=64, cause=OomCause.PROCESS_KILLED, elapsed_ms=5, attempt=1, partial=partial
    )
    assert "the kernel killed a process it started" in result.text
    assert "what it returned: " + partial in result.text
    assert result.details["partial"] == partial


def test_the_kernels_oom_kill_is_told_from_a_crash() -> None:
    assert lost_child_reason(1) is SyntheticReason.OUT_OF_MEMORY
    assert lost_child_reason(0) is SyntheticReason.CRASHED


def test_flower_shows_out_of_memory_as_its_own_failure_class() -> None:
    result = out_of_memory_result(CALL, limit_mb=256, cause=OomCause.CHILD_KILLED, elapsed_ms=5, attempt=1)
    failure = outcome_of(result).failure()
    assert type(failure) is CALL_FAILURES[SyntheticReason.OUT_OF_MEMORY]
    assert failure.reason == "out_of_memory"


def test_rlimit_adds_the_allowance_to_what_is_mapped_and_stays_under_the_hard_limit() -> None:
    assert data_rlimit_bytes(100 * MIB, 256, -1) == 356 * MIB
    assert data_rlimit_bytes(100 * MIB, 256, 200 * MIB) == 200 * MIB


# --- finding the cgroup -------------------------------------------------------------------------


def _proc(tmp_path: Path, cgroup: str, mountinfo: str) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(mountinfo)
    return proc


def test_v1_memory_hierarchy_is_found_below_this_process_cgroup(tmp_path: Path) -> None:
    proc = _proc(
        tmp_path,
        "5:devices:/\n4:memory:/jobs/abc\n0::/\n",
        "30 25 0:26 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "31 25 0:27 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n",
    )
    layout = find_layout(42, proc_self=proc)
    assert layout == CgroupLayout(
        1,
        Path("/sys/fs/cgroup/memory/jobs/abc"),
        Path("/sys/fs/cgroup/memory/jobs/abc/unstuck-42"),
        Path("/sys/fs/cgroup/memory/jobs/abc"),
    )
    assert isinstance(layout, CgroupLayout)
    assert layout.call_dir(7) == Path("/sys/fs/cgroup/memory/jobs/abc/unstuck-42/c7")


def test_a_mount_of_part_of_the_hierarchy_maps_the_path_below_its_root(tmp_path: Path) -> None:
    # A container sees its own cgroup mounted at /sys/fs/cgroup/memory
    proc = _proc(
        tmp_path,
        "4:memory:/docker/abc/app\n",
        "30 25 0:26 /docker/abc /sys/fs/cgroup/memory ro,relatime - cgroup cgroup rw,memory\n",
    )
    layout = find_layout(9, proc_self=proc)
    assert isinstance(layout, CgroupLayout)
    assert layout.own == Path("/sys/fs/cgroup/memory/app")


def test_v2_needs_the_memory_controller_and_homes_the_worker_in_a_leaf(tmp_path: Path) -> None:
    mount = tmp_path / "cg2"
    (mount / "svc").mkdir(parents=True)
    proc = _proc(tmp_path, "0::/svc\n", f"31 25 0:27 / {mount} rw - cgroup2 cgroup2 rw\n")
    assert "no memory controller" in str(find_layout(3, proc_self=proc))
    (mount / "svc" / "cgroup.controllers").write_text("cpu io memory pids\n")
    layout = find_layout(3, proc_self=proc)
    assert layout == CgroupLayout(2, mount / "svc", mount / "svc/unstuck-3", mount / "svc/unstuck-3/main")


def test_no_cgroup_mount_says_why(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "4:memory:/x\n", "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n")
    assert "no cgroup v1 memory hierarchy" in str(find_layout(3, proc_self=proc))


def test_oom_kills_are_read_from_either_versions_counter_file(tmp_path: Path) -> None:
    for version, name, text in (
        (1, "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"),
        (2, "memory.events", "low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\noom_group_kill 0\n"),
    ):
        call = tmp_path / f"v{version}" / "c1"
        call.mkdir(parents=True)
        (call / name).write_text(text)
        cgroups = MemoryCgroups(CgroupLayout(version, tmp_path, call.parent, tmp_path))
        assert cgroups.oom_kills(call) == (2 if version == 1 else 1)
        assert cgroups.oom_kills(call.parent / "gone") == 0


# --- the guard, in this process -----------------------------------------------------------------


def test_rlimit_turns_an_allocation_past_the_limit_into_memory_error_and_is_restored() -> None:
    guard = MemoryGuard(None)
    before = resource.getrlimit(resource.RLIMIT_DATA)
    with guard.limit(64) as memory, pytest.raises(MemoryError):
        bytearray(512 * MIB)
    assert memory.cgroup is None
    assert resource.getrlimit(resource.RLIMIT_DATA) == before
    assert len(bytearray(128 * MIB)) == 128 * MIB  # lifted: the same allocation size fits again


def test_no_limit_touches_nothing() -> None:
    guard = MemoryGuard(None)
    before = resource.getrlimit(resource.RLIMIT_DATA)
    with guard.limit(None) as memory:
        assert resource.getrlimit(resource.RLIMIT_DATA) == before
    assert memory.cgroup is None


_LAYOUT = find_layout(os.getpid())
needs_cgroups = pytest.mark.skipif(
    isinstance(_LAYOUT, str) or os.geteuid() != 0, reason=f"no memory cgroup can be made here: {_LAYOUT}"
)


# The guard runs in a helper process standing in for a pool child: the kernel's OOM killer
# picks the biggest process of a full cgroup, and that must never be pytest.
_HELPER = """
import json, os, subprocess, sys
from workers.worker.memory_cgroups import open_memory_cgroups
from workers.worker.memory_guard import MemoryGuard
cgroups = open_memory_cgroups(os.getpid())
guard = MemoryGuard(cgroups)
limit_mb, child_mb = int(sys.argv[1]), int(sys.argv[2])
with guard.limit(limit_mb) as memory:
    inside = str(os.getpid()) in (memory.cgroup / "cgroup.procs").read_text().split()
    code = f"data = b'x' * ({child_mb} << 20)"
    status = subprocess.run([sys.executable, "-c", code], check=False).returncode
home = str(os.getpid()) in (cgroups.layout.home / "cgroup.procs").read_text().split()
report = {"inside": inside, "status": status, "oom_kills": memory.oom_kills, "home": home,
          "cgroup_kept": memory.cgroup.exists()}
(cgroups.layout.home / "cgroup.procs").write_text(str(os.getpid()))  # as a worker's shutdown finds it
cgroups.close()
report["parent_gone"] = not cgroups.layout.parent.exists()
print(json.dumps(report))
"""


def _guarded_child(limit_mb: int, child_mb: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _HELPER, str(limit_mb), str(child_mb)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    report: dict[str, Any] = json.loads(done.stdout)
    return report


@needs_cgroups
def test_a_process_started_under_the_limit_is_oom_killed_and_counted() -> None:
    report = _guarded_child(256, 1024)
    assert report == {
        "inside": True,  # the child ran the call inside its cgroup
        "status": -9,  # SIGKILL from the kernel, not a MemoryError of its own
        "oom_kills": 1,
        "home": True,  # and the cgroup that had a kill was retired: the child went home
        "cgroup_kept": False,
        "parent_gone": True,
    }


@needs_cgroups
def test_a_process_inside_the_limit_runs_and_nothing_is_counted() -> None:
    report = _guarded_child(256, 64)
    # the child keeps its cgroup for its next calls; the worker's shutdown removes it
    assert (report["status"], report["oom_kills"], report["cgroup_kept"], report["home"]) == (
        0,
        0,
        True,
        False,
    )
    assert report["parent_gone"] is True


@needs_cgroups
def test_a_dead_childs_call_cgroup_is_read_then_swept_after_its_grace() -> None:
    # Given the call cgroup a pool child left when it was killed
    assert isinstance(_LAYOUT, CgroupLayout)
    cgroups = MemoryCgroups(_LAYOUT)  # unstuck-<this pid>: no other test process shares it
    cgroups.prepare(os.getpid())
    guard = MemoryGuard(cgroups)
    dead = cgroups.layout.call_dir(999_999_999)
    dead.mkdir()
    try:
        assert guard.lost_child_oom_kills(999_999_999) == 0
        # When the lease keeper sweeps, first now, then after the grace
        guard.sweep(lambda _pid: False, now_s=100.0)
        kept = dead.exists()
        guard.sweep(lambda _pid: False, now_s=106.0)  # past the grace and the sweep interval
        # Then
        assert kept, "kept for the paths that still answer the dead child's call"
        assert not dead.exists()
    finally:
        cgroups.close()
    assert not _LAYOUT.parent.exists()
