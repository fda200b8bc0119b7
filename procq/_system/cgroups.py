"""Cgroups for a sandboxed lane's jobs (Linux): one per worker, made by the
supervisor below its own cgroup, holding only the processes of the job that
worker runs (one at a time), so that the kernel bounds the tasks a job may
make (the ``pids`` controller) and the memory it may hold (``memory``: its
temporary files on tmpfs count, as the kernel charges a tmpfs page to the
cgroup of the process that wrote it).

Both layouts are used: cgroup v1 (a hierarchy per controller, each mounted
apart) and cgroup v2 (one hierarchy). A controller is usable where the
supervisor may make a cgroup below its own that has it: in v1, a directory
it may write (root's, as a rule); in v2, where the supervisor's own cgroup
already lists the controller in its ``cgroup.subtree_control`` (procq never
changes that file: it is the cgroup's owner's, systemd's as a rule). v2
lets a cgroup that holds processes, as the supervisor's does, give its
children ``pids`` (a threaded controller) but ``memory`` only in the root
cgroup. ``usable()`` says, for each controller, where, or why not; the
worker's side (joining, the count of memory kills) is ``JobCgroup``.

A worker's cgroup is removed when the supervisor reaps the worker
(``remove_soon``): by then the worker, the PID 1 of its jobs' namespace, has
taken every process of its jobs with it, though some may still be exiting;
a cgroup not yet empty is left to a thread of its own to remove, so that the
I/O thread never waits for it. Cgroups left by a supervisor that
was killed are removed by the next one that looks (``usable``).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import select
import signal
import threading
import time
from dataclasses import dataclass

from procq._system.processes import pid_alive

__all__ = ["CONTROLLERS", "JobCgroup", "Place", "make", "remove", "remove_soon", "settle", "usable"]

#: The controllers a sandbox uses: tasks (processes and threads), memory.
CONTROLLERS = ("pids", "memory")
#: How long ``remove`` waits for the processes still in a cgroup to exit once killed.
_REMOVE_WAIT = 5.0
#: How long the remover's thread keeps trying (it holds up no one), and how
#: long it lingers with nothing to do.
_REMOVER_PATIENCE = 60.0
_REMOVER_IDLE = 5.0
#: Between two tries at a cgroup that is busy with no process listed.
_RETRY = 0.01
_PREFIX = "procq-"
_NAME = re.compile(r"procq-(\d+)-\d+$")
_counter = itertools.count(1)


@dataclass(frozen=True)
class Place:
    """Where this process may make cgroups with ``controller``: below ``parent``, in a cgroup ``version`` hierarchy."""

    controller: str
    version: int
    parent: str

    def describe(self) -> str:
        return f"a {self.controller} cgroup (cgroup v{self.version}, below {self.parent})"


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per v1 controller, and ``""`` for the v2 hierarchy."""
    found: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            number, controllers, path = line.rstrip("\n").split(":", 2)
            if number == "0" and not controllers:
                found[""] = path
            for name in controllers.split(","):
                if name:
                    found[name] = path
    return found


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """The cgroup mounts: (v1 controller or "" for v2, the mount's root in its hierarchy, mount point, options)."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            fstype, options = fields[sep + 1], set(fields[sep + 3].split(","))
            if fstype in ("cgroup", "cgroup2"):
                found.append(("" if fstype == "cgroup2" else fstype, fields[3], fields[4], options))
    return found


def _place(controller: str) -> Place | str:
    """Where ``controller`` may be used below this process's cgroup, or why not."""
    own = _own_cgroups()
    mounts = _mounts()
    for kind, root, point, options in mounts:
        if kind == "cgroup" and controller in options and controller in own:
            return _writable(Place(controller, 1, _inside(point, root, own[controller])))
    for kind, root, point, _ in mounts:
        if kind == "" and "" in own:
            parent = _inside(point, root, own[""])
            try:
                with open(os.path.join(parent, "cgroup.subtree_control")) as f:
                    delegated = f.read().split()
            except OSError as exc:
                return f"cgroup v2: {parent}/cgroup.subtree_control could not be read ({exc.strerror})"
            if controller not in delegated:
                return (
                    f"cgroup v2: this process's cgroup {parent} does not give its children the {controller} "
                    f"controller (its cgroup.subtree_control has {' '.join(delegated) or 'none'}), and procq makes "
                    "its workers' cgroups below its own. Enabling it there needs the right to write that file "
                    "(root, or a cgroup delegated to this user)"
                    + (
                        ", and for memory a cgroup with no process of its own: cgroup v2 allows that only in the "
                        "root cgroup"
                        if controller == "memory"
                        else ""
                    )
                )
            return _writable(Place(controller, 2, parent))
    return f"no {controller} controller is mounted here (neither a cgroup v1 hierarchy nor cgroup v2)"


def _inside(point: str, root: str, path: str) -> str:
    """Where the cgroup ``path`` is, under a mount at ``point`` of the hierarchy's ``root``."""
    relative = os.path.relpath(path, root)
    if relative.startswith(".."):
        raise ValueError(f"this process's cgroup {path} is outside the mount {point} (of {root})")
    return os.path.normpath(os.path.join(point, relative))


def _writable(place: Place) -> Place | str:
    """``place`` if this process may make a cgroup there (tried), else why not;
    cgroups a killed supervisor left there are removed first."""
    _remove_stale(place.parent)
    probe = os.path.join(place.parent, f"{_PREFIX}{os.getpid()}-0")  # (workers' count from 1)
    try:
        os.mkdir(probe)
    except OSError as exc:
        return (
            f"{place.describe()} cannot be made by this process ({exc.strerror}): that needs root or a delegated cgroup"
        )
    os.rmdir(probe)
    return place


def _remove_stale(parent: str) -> None:
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            match = _NAME.match(name)
            if match and not pid_alive(int(match.group(1))):
                remove([os.path.join(parent, name)])


_usable: dict[str, Place | str] | None = None
# Held while the answer is found: two queues opening at once would both make
# the probe's cgroup, and the one that found it made would be refused.
_usable_lock = threading.Lock()


def usable() -> dict[str, Place | str]:
    """For each controller, where this process may use it, or why not (asked once per process)."""
    global _usable
    with _usable_lock:
        if _usable is None:
            found: dict[str, Place | str] = {}
            for controller in CONTROLLERS:
                try:
                    found[controller] = _place(controller)
                except (OSError, ValueError) as exc:
                    found[controller] = f"the cgroups of this process could not be read ({exc})"
            _usable = found
        return _usable


# --- a worker's cgroup, from the supervisor --------------------------------------------------


def make(places: dict[str, Place], pids_max: int | None, memory_max: int | None) -> dict[str, str]:
    """Make a new worker's cgroup where ``places`` say, with its limits; the
    directory made for each controller (in v2, one for both). Raises
    ``OSError`` (having removed what it made) if the kernel refuses."""
    name = f"{_PREFIX}{os.getpid()}-{next(_counter)}"
    dirs: dict[str, str] = {}
    try:
        for controller, place in places.items():
            path = os.path.join(place.parent, name)
            if path not in dirs.values():
                os.mkdir(path, 0o755)
            dirs[controller] = path
        if "pids" in dirs and pids_max is not None:
            _write(dirs["pids"], "pids.max", str(pids_max))
        if "memory" in dirs and memory_max is not None:
            v1 = places["memory"].version == 1
            _write(dirs["memory"], "memory.limit_in_bytes" if v1 else "memory.max", str(memory_max))
            # No swap beyond it, where the kernel accounts swap (v1 needs the sum, v2 the swap alone).
            swap = ("memory.memsw.limit_in_bytes", str(memory_max)) if v1 else ("memory.swap.max", "0")
            if os.path.exists(os.path.join(dirs["memory"], swap[0])):
                _write(dirs["memory"], *swap)
    except OSError:
        remove(list(dirs.values()))
        raise
    return dirs


def _write(directory: str, name: str, value: str) -> None:
    with open(os.path.join(directory, name), "w") as f:
        f.write(value)


def remove(dirs: list[str], wait: float = _REMOVE_WAIT) -> list[str]:
    """Remove a worker's cgroups; those it could not remove in time. Processes
    still in one (a worker killed an instant ago takes its jobs' processes
    with it, which may still be exiting) are killed, and waited for, for at
    most ``wait`` seconds in all."""
    deadline = time.monotonic() + wait
    return [path for path in dict.fromkeys(dirs) if not _remove_one(path, deadline)]


def _remove_one(path: str, deadline: float) -> bool:
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                return False
        if not kill_and_wait(path, deadline):
            return False
        if not _listed(path):
            # Busy with no process listed: one whose exit the kernel has yet
            # to finish accounting, or a cgroup below it. A moment, then again.
            time.sleep(min(_RETRY, max(0.0, deadline - time.monotonic())))


class _Remover:
    """Removes, on a thread of its own, the cgroups that could not be
    removed at once: waiting for their processes to exit must never hold up
    the I/O thread, which reaps workers while it serves every other lane."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued: list[tuple[list[str], threading.Event]] = []
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def remove_soon(self, dirs: list[str]) -> threading.Event:
        """Remove ``dirs`` now if they are empty, else hand them to the thread;
        set once every one is gone or has been given up on."""
        done = threading.Event()
        busy = remove(dirs, wait=0.0)
        if not busy:
            done.set()
            return done
        with self._lock:
            self._queued.append((busy, done))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="procq-cgroups", daemon=True)
                self._thread.start()
            self._wake.notify()
        return done

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queued:
                    if not self._wake.wait(timeout=_REMOVER_IDLE) and not self._queued:
                        self._thread = None  # idle: a later removal starts another
                        return
                dirs, done = self._queued[0]
            try:
                remove(dirs, wait=_REMOVER_PATIENCE)
            finally:
                with self._lock:
                    self._queued.pop(0)
                done.set()

    def settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every removal handed over so far; True if all ended."""
        deadline = time.monotonic() + timeout
        with self._lock:
            waiting = [done for _, done in self._queued]
        return all(done.wait(max(0.0, deadline - time.monotonic())) for done in waiting)


_remover = _Remover()


def remove_soon(dirs: list[str]) -> threading.Event:
    """Remove a worker's cgroups without waiting for their processes: what is
    empty goes now, the rest on a thread of procq's (killed, waited for up to
    a minute). The event is set once all are gone or given up on."""
    return _remover.remove_soon(dirs)


def settle(timeout: float = _REMOVE_WAIT) -> bool:
    """Wait up to ``timeout`` seconds for the removals ``remove_soon`` handed
    to its thread (a closing queue leaves no cgroup behind); True if all ended."""
    return _remover.settle(timeout)


def kill_and_wait(path: str, deadline: float) -> bool:
    """Kill the processes in the cgroup ``path`` and wait until they have
    exited or ``deadline`` passed; False if it passed (or they cannot be listed)."""
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            pids = [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return False
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except OSError:
            continue  # gone already
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    try:
        waiting = list(fds)
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select(waiting, [], [], left)
            waiting = [fd for fd in waiting if fd not in ready]
    finally:
        for fd in fds:
            os.close(fd)
    return time.monotonic() < deadline


def _listed(path: str) -> bool:
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return bool(f.read().strip())
    except OSError:
        return False


# --- the worker's side ----------------------------------------------------------------------


class JobCgroup:
    """In a sandboxed worker, before it enters its namespaces (the cgroup
    files are not in its jobs' view) and drops its privileges: the files it
    needs open. A job's process joins the cgroup before job code runs; the
    worker reads the count of memory kills around each job."""

    def __init__(self, dirs: dict[str, str], memory_version: int) -> None:
        self.dirs = list(dict.fromkeys(dirs.values()))
        self._procs = [
            os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
            for path in dict.fromkeys(dirs.values())
        ]
        self._events: int | None = None
        if "memory" in dirs:
            name = "memory.oom_control" if memory_version == 1 else "memory.events"
            self._events = os.open(os.path.join(dirs["memory"], name), os.O_RDONLY | os.O_CLOEXEC)

    def join(self) -> None:
        """In the job's process: move itself into the worker's cgroup (``0`` is the writer)."""
        for fd in self._procs:
            os.write(fd, b"0")

    def end_leftovers(self) -> None:
        """In the worker, once the job's process has exited, where its jobs
        have no PID namespace of their own to end with them: kill what the
        job left running in the cgroup, and wait for it to exit. A process
        forked while the others were killed is killed in the next round."""
        deadline = time.monotonic() + _REMOVE_WAIT
        for path in self.dirs:
            while _listed(path) and kill_and_wait(path, deadline):
                pass

    def memory_kills(self) -> int:
        """How many processes the kernel has killed in this cgroup for its memory limit."""
        if self._events is None:
            return 0
        for line in os.pread(self._events, 4096, 0).decode().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
        return 0
