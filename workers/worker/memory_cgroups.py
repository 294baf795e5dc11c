"""A memory cgroup per call: the kernel's exact count of what a call adds, and its OOM kills.

The worker's main process makes one directory of its own, ``unstuck-<pid>``, below the
cgroup it was started in (cgroup v1's memory hierarchy, or the unified v2 hierarchy with
the memory controller). A pool child makes ``c<child pid>`` there at its first limited
call and moves in (whatever it starts is born inside); its memory from before stays
charged where it was. Each call's limit is what the cgroup holds at the call's start plus
the call's allowance, so the cgroup counts what the call adds. When it is full the
kernel's OOM killer kills a process of the call only (the biggest: a process the tool
started, or the pool child itself), and the cgroup's ``oom_kill`` counter says so.

v2 allows processes only in leaf cgroups that hand out controllers, so there the main
process first moves into ``unstuck-<pid>/main`` (its ``home``): that works when the worker
has a cgroup to itself (systemd ``Delegate=yes``), and is refused otherwise.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CgroupLayout", "MemoryCgroups", "find_layout", "open_memory_cgroups", "remove_stale_workers"]

_PROC_SELF = Path("/proc/self")


@dataclass(frozen=True)
class CgroupLayout:
    """Where this worker's call cgroups live and where a pool child returns after a call."""

    version: int  # 1 or 2
    own: Path  # the cgroup the worker was started in
    parent: Path  # unstuck-<main pid>, one per worker process
    home: Path  # where the main process and idle pool children are

    def call_dir(self, pid: int) -> Path:
        """The cgroup of the call pool child ``pid`` is running."""
        return self.parent / f"c{pid}"


def _mounts(proc_self: Path) -> list[tuple[str, str, str, set[str]]]:
    """(root, mount point, fs type, super options) of every cgroup mount this process sees."""
    found = []
    for line in (proc_self / "mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            found.append((fields[3], fields[4], tail[0], set(tail[2].split(","))))
    return found


def _below(mount_root: str, mount_point: str, cgroup_path: str) -> Path | None:
    root = mount_root.rstrip("/")
    if cgroup_path != root and not cgroup_path.startswith(root + "/"):
        return None  # our cgroup is not visible through this mount
    return Path(mount_point + cgroup_path[len(root) :])


def find_layout(main_pid: int, *, proc_self: Path = _PROC_SELF) -> CgroupLayout | str:
    """This process's memory cgroup and the layout below it, or why there is none.

    v1's memory controller is preferred where both exist (a hybrid host binds it to v1).
    """
    try:
        lines = (proc_self / "cgroup").read_text().splitlines()
        mounts = _mounts(proc_self)
    except OSError as exc:
        return f"cannot read {proc_self}/cgroup or mountinfo: {exc.strerror}"
    entries = [line.split(":", 2) for line in lines if line.count(":") >= 2]
    v1 = next((path for _, names, path in entries if "memory" in names.split(",")), None)
    v2 = next((path for ident, names, path in entries if ident == "0" and names == ""), None)
    for root, point, fstype, options in mounts:
        if v1 is not None and fstype == "cgroup" and "memory" in options:
            own = _below(root, point, v1)
            if own is not None:
                return CgroupLayout(1, own, own / f"unstuck-{main_pid}", own)
    for root, point, fstype, _ in mounts:
        if v2 is not None and fstype == "cgroup2":
            own = _below(root, point, v2)
            if own is None:
                continue
            if "memory" not in _read(own / "cgroup.controllers").split():
                return f"cgroup v2 at {own} has no memory controller"
            parent = own / f"unstuck-{main_pid}"
            return CgroupLayout(2, own, parent, parent / "main")
    return "no cgroup v1 memory hierarchy or cgroup v2 mount holds this process"


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _read_fd(path: str) -> str:
    """:func:`_read` on a path string, without a file object (a pool child reads usage per call)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return ""
    try:
        return os.read(fd, 64).decode()
    except OSError:
        return ""
    finally:
        os.close(fd)


def _write(path: Path | str, value: str) -> None:
    # cgroupfs takes one write per value: no buffering that could split or merge it.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _oom_eventfd(path: Path) -> int | None:
    """An eventfd the kernel signals when ``path`` (a v1 memory cgroup) runs out of memory."""
    try:
        event = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    except OSError:
        return None
    control = -1
    try:
        control = os.open(path / "memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
        _write(path / "cgroup.event_control", f"{event} {control}")
    except OSError:
        os.close(event)
        return None
    finally:
        if control >= 0:
            os.close(control)  # the registration holds its own reference
    return event


def _counter(text: str, name: str) -> int:
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return 0


def remove_stale_workers(own: Path) -> None:
    """Remove what workers that died without their shutdown left empty below ``own``."""
    with contextlib.suppress(OSError):
        for entry in os.listdir(own):
            pid = entry.removeprefix("unstuck-")
            if entry.startswith("unstuck-") and pid.isdigit() and not Path(f"/proc/{pid}").exists():
                stale = own / entry
                for path in [*(p for p in stale.iterdir() if p.is_dir()), stale]:
                    with contextlib.suppress(OSError):  # still populated: its processes outlive it
                        path.rmdir()


class MemoryCgroups:
    """The call cgroups of one worker (``layout``); every method is safe in any pool child.

    A pool child makes its cgroup at its first limited call and stays in it, and each call
    re-arms the limit at what the cgroup holds now plus the call's allowance: one read and
    one write per call instead of creating, joining, leaving and removing a cgroup (its cost:
    docs/performance.md). The count stays the call's own: what the child
    held before is the baseline. A cgroup whose ``oom_kill`` counter rose is retired at once,
    so at every call's start the counter is 0 and a raised one names the running call.
    """

    def __init__(self, layout: CgroupLayout) -> None:
        self.layout = layout
        v1 = layout.version == 1
        self._limit_file = "memory.limit_in_bytes" if v1 else "memory.max"
        self._usage_file = "memory.usage_in_bytes" if v1 else "memory.current"
        self._events_file = "memory.oom_control" if v1 else "memory.events"
        self._unlimited = "-1" if v1 else "max"
        self._joined: Path | None = None  # this process's own cgroup, once it joined one
        # The joined cgroup's usage and limit files, as the paths os.open takes: per call they
        # cost two pathlib joins and a text read's decoding layers otherwise.
        self._armed_files: tuple[int, Path, str, str] | None = None
        self._limited = False
        self._oom_event: int | None = None  # v1: an eventfd the kernel signals on an OOM in it

    def prepare(self, main_pid: int) -> None:
        """Create this worker's directory (main process, before the pool forks); raises OSError."""
        layout = self.layout
        remove_stale_workers(layout.own)
        layout.parent.mkdir(exist_ok=True)
        if layout.version == 1:
            if not (layout.parent / self._limit_file).exists():
                raise OSError(errno.ENOTSUP, f"{layout.parent} has no {self._limit_file}")
            return
        layout.home.mkdir(exist_ok=True)
        _write(layout.home / "cgroup.procs", str(main_pid))
        try:
            if "memory" not in _read(layout.own / "cgroup.subtree_control").split():
                _write(layout.own / "cgroup.subtree_control", "+memory")
            _write(layout.parent / "cgroup.subtree_control", "+memory")
        except OSError:
            _write(layout.own / "cgroup.procs", str(main_pid))  # back where it was
            self.close()
            raise

    def arm(self, pid: int, limit_bytes: int) -> Path:
        """Bound what ``pid`` (this process) and all it starts add from now on to ``limit_bytes``.

        Joins ``pid``'s own cgroup first if it is in none yet. Raises OSError.
        """
        files = self._armed_files
        if files is None or files[0] != pid or self._joined is not files[1]:
            path = self.layout.call_dir(pid)
            if self._joined != path:
                self._join(path, pid)
            path = self._joined or path  # the very object _join keeps: compared by identity above
            files = (pid, path, str(path / self._usage_file), str(path / self._limit_file))
            self._armed_files = files
        _, path, usage, limit = files
        held = int(_read_fd(usage) or 0)
        _write(limit, str(held + limit_bytes))
        self._limited = True
        return path

    def unbound(self) -> None:
        """Lift the limit of this process's cgroup for a call that has none (nothing if not limited)."""
        if self._joined is not None and self._limited:
            with contextlib.suppress(OSError):
                _write(self._joined / self._limit_file, self._unlimited)
            self._limited = False

    def _join(self, path: Path, pid: int) -> None:
        if path.exists():  # left by a dead pool child whose pid this one got
            self.discard(path)
        path.mkdir()
        try:
            # The limit must bind in RAM: swapping at it would be slow instead of prompt.
            with contextlib.suppress(OSError):  # v1 without swap accounting: nothing to bound
                _write(path / ("memory.swappiness" if self.layout.version == 1 else "memory.swap.max"), "0")
            _write(path / "cgroup.procs", str(pid))
        except OSError:
            self.discard(path)
            raise
        self._joined, self._limited = path, False
        if self.layout.version == 1:
            self._oom_event = _oom_eventfd(path)

    def _oom_signalled(self) -> bool:
        """Whether the kernel signalled an OOM in this process's cgroup (True when it cannot say)."""
        if self._oom_event is None:
            return True
        try:
            return os.eventfd_read(self._oom_event) > 0
        except BlockingIOError:
            return False

    def _close_oom_event(self) -> None:
        if self._oom_event is not None:
            with contextlib.suppress(OSError):
                os.close(self._oom_event)
            self._oom_event = None

    def finish(self, path: Path, pid: int) -> int:
        """The OOM kills of the call that ran in ``path``; a cgroup that had any is retired.

        On v1 the counter is read only when the kernel signalled an OOM (an eventfd read,
        about a microsecond, instead of a cgroupfs read of about a hundred).
        """
        if not self._oom_signalled():
            return 0
        kills = self.oom_kills(path)
        if kills:
            _write(self.layout.home / "cgroup.procs", str(pid))
            self._joined = None
            self._close_oom_event()
            self.discard(path)
        return kills

    def oom_kills(self, path: Path) -> int:
        """How many processes the kernel's OOM killer killed in ``path`` (0 if it is gone)."""
        return _counter(_read(path / self._events_file), "oom_kill")

    def discard(self, path: Path) -> None:
        """Remove ``path``; processes still in it keep it (and its limit), renamed ``left-<pid>-<ns>``.

        Nothing is killed: what a tool started and left running outlives the call as it
        always did, and its cgroup is removed by a later :meth:`sweep` once it is empty.
        """
        try:
            path.rmdir()
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            with contextlib.suppress(OSError):
                path.rename(self.layout.parent / f"left-{path.name}-{time.monotonic_ns()}")

    def sweep(self, alive: Callable[[int], bool]) -> None:
        """Remove the cgroups of dead pool children and the emptied ones of processes left behind."""
        try:
            names = os.listdir(self.layout.parent)
        except OSError:
            return
        for name in names:
            path = self.layout.parent / name
            if name.startswith("c") and name[1:].isdigit() and not alive(int(name[1:])):
                with contextlib.suppress(OSError):
                    self.discard(path)
            elif name.startswith("left-") and not _read(path / "cgroup.procs").split():
                with contextlib.suppress(OSError):
                    path.rmdir()

    def close(self) -> None:
        """Remove this worker's directory where nothing runs in it any more (worker shutdown)."""
        self.sweep(lambda _pid: False)
        with contextlib.suppress(OSError):
            if self.layout.home != self.layout.own:
                self.layout.home.rmdir()
            self.layout.parent.rmdir()


def open_memory_cgroups(main_pid: int) -> MemoryCgroups | str:
    """This worker's call cgroups, ready for the pool to fork; or why they cannot be made."""
    layout = find_layout(main_pid)
    if isinstance(layout, str):
        return layout
    cgroups = MemoryCgroups(layout)
    try:
        cgroups.prepare(main_pid)
    except OSError as exc:
        return f"cannot create a memory cgroup below {layout.own} (cgroup v{layout.version}): {exc}"
    return cgroups
