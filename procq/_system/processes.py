"""Worker processes as the supervisor sees them: starting an untrusted one,
telling its death, measuring its memory, signalling its tree, waiting for it
to exit.

Everything here is a plain function of a pid or a process object; the
process channels (``_supervisor.channels``) call them when the I/O thread (``_supervisor.loop``)
says. On Linux a worker's death is watched through a pidfd, its tree found
through ``/proc`` (each process's parent, from ``/proc/<pid>/stat``), its
resident memory read from ``/proc/<pid>/statm``, and a job's memory measured
as its tree's proportional set size (see ``tree_memory``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from procq._model.job import Lane
from procq._system.privileges import untraceable

__all__ = [
    "ExecProcess",
    "children_map",
    "describe_exit",
    "find_descendants",
    "import_path",
    "is_stopped",
    "next_sample",
    "pid_alive",
    "pidfd",
    "process_pss",
    "process_rss",
    "signal_group",
    "tree_memory",
    "tree_rss",
    "wait_for_exits",
    "worker_config",
]

_SIGNAL_HINTS = {
    "SIGSEGV": "a segmentation fault: native code run by the job crashed",
    "SIGBUS": "a bus error: native code run by the job crashed",
    "SIGILL": "an illegal instruction: native code run by the job crashed",
    "SIGFPE": "an arithmetic fault in native code run by the job",
    "SIGABRT": "abort() was called: os.abort(), a failed C assertion, or a fatal runtime error",
    "SIGKILL": "killed with SIGKILL: by the kernel's OOM killer if memory ran out, or by another process",
    "SIGTERM": "terminated by another process",
    "SIGXCPU": "the job used up its CPU-time limit (the lane's rlimits['cpu'])",
}


def process_rss(pid: int | None) -> int:
    """A process's resident memory in bytes (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.Process(pid).memory_info().rss)
    except Exception:
        return 0


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def find_descendants(pid: int) -> list[Any]:
    """psutil handles on every process below ``pid`` (they check their own
    identity before a signal, so a pid reused meanwhile is never hit)."""
    try:
        import psutil

        return list(psutil.Process(pid).children(recursive=True))
    except Exception:
        return []


def children_map() -> dict[int, list[int]]:
    """Parent pid -> child pids, for every process, from one scan.

    Read from ``/proc/<pid>/stat`` directly: about ten times cheaper than
    psutil's ``process_iter``, and this runs every memory sample."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:  # pragma: no cover - no /proc: psutil knows other ways
        return _children_map_psutil()
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            # "pid (comm) state ppid ...": comm may hold anything, even ")".
            ppid = int(data[data.rindex(b")") + 2 :].split(None, 2)[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(name))
    return children


def _children_map_psutil() -> dict[int, list[int]]:  # pragma: no cover - not Linux
    children: dict[int, list[int]] = {}
    try:
        import psutil

        for proc in psutil.process_iter(["ppid"]):
            children.setdefault(proc.info["ppid"], []).append(proc.pid)
    except Exception:
        pass
    return children


def _tree(pid: int, children: dict[int, list[int]]) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def tree_rss(pid: int, children: dict[int, list[int]]) -> int:
    """Resident memory of ``pid`` and every process below it, each counted
    whole: pages two of them share are counted twice."""
    return sum(process_rss(p) for p in _tree(pid, children))


def process_pss(pid: int | None) -> int:
    """A process's proportional set size in bytes: its resident pages, each
    divided by the number of processes that map it (0 if it is gone).

    Summed over a process tree, a page its processes share (a forked child's
    copy-on-write pages, say) counts once, not once per process; a page
    shared with processes outside the tree counts for the tree's share. Where
    the kernel does not tell (no ``smaps_rollup``: before Linux 4.14), it is
    the resident size."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            data = f.read()
        at = data.index(b"\nPss:") + 5
        return int(data[at : data.index(b"kB", at)]) * 1024
    except (OSError, ValueError):
        return process_rss(pid)


def next_sample(began: float, ended: float, interval: float) -> float:
    """When to take the next memory sample, after one that ran from about
    ``began`` (when the I/O thread's turn that took it began) to ``ended``:
    ``interval`` later, or, after a costly sample (a large tree
    read by proportional sizes, see ``tree_memory``), a pause four times as
    long as it took, so that sampling never takes more than a fifth of the
    I/O thread's time."""
    return ended + max(interval, 4 * (ended - began))


def tree_memory(pid: int, children: dict[int, list[int]], base: int, limit: int | None) -> int:
    """What the tree below (and with) ``pid`` uses beyond ``base`` (the
    worker's ``process_pss`` when its job started), in bytes: the sum of its
    processes' proportional set sizes, less ``base``.

    A proportional set size costs the kernel a walk of the process's page
    tables (about half a millisecond for a Python process), a resident size
    almost nothing. The resident sizes are summed first: that sum is never
    below the proportional one, so while it minus ``base`` is within
    ``limit``, so is the tree, and it is returned as it is. Only past that are
    the proportional sizes read."""
    pids = _tree(pid, children)
    upper = sum(process_rss(p) for p in pids) - base
    if limit is not None and upper <= limit:
        return upper
    return sum(process_pss(p) for p in pids) - base


def describe_exit(exitcode: int | None) -> tuple[str | None, str, str]:
    """(signal name, what happened, likely cause) for a dead worker's exit code."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return name, f"was killed by {name} (signal {-exitcode})", _SIGNAL_HINTS.get(name, "")
    if exitcode is None:
        return None, "vanished without an exit status", ""
    return None, f"exited with code {exitcode}", "os._exit(), or exit() in native code, ended it mid-job"


def worker_config(spec: Lane) -> dict[str, Any]:
    """What a worker needs to know of its lane, as plain data (it travels as JSON)."""
    return {
        "max_result_bytes": spec.max_result,
        "rlimits": spec.rlimits,
        "env": spec.env,
        "inherit_env": spec.inherit_env,
        # A trusted worker may be forked from a forkserver started long ago:
        # it takes the supervisor's environment as it is now, not as it was then.
        "environ": dict(os.environ) if spec.trusted and spec.inherit_env else None,
        "cwd": spec.cwd,
        # A trusted worker stays untraceable (as the forkserver made it) once
        # this process has opened an untrusted lane; else it is dumpable again,
        # so a native crash in it can leave a core dump.
        "untraceable": untraceable(),
    }


def import_path() -> list[str]:
    """The supervisor's import path, for an untrusted worker started with
    ``-I`` (which ignores PYTHONPATH and the current directory): it must import
    procq and the modules the jobs' functions come from."""
    return [os.path.abspath(p) if p else os.getcwd() for p in sys.path]


class ExecProcess:
    """The parts of ``multiprocessing.Process`` the supervisor uses, for a
    worker started with ``subprocess``."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid: int = popen.pid
        self.sentinel = pidfd(popen.pid)
        if self.sentinel is None:  # pragma: no cover - no pidfds: Linux < 5.3 or not Linux
            raise OSError("untrusted lanes need pidfd_open (Linux 5.3 or later)")

    @property
    def exitcode(self) -> int | None:
        return self._popen.returncode

    def join(self) -> None:
        self._popen.wait()

    def close(self) -> None:
        pass  # its sentinel is closed by its channel (ProcessChannel.release)


def pid_alive(pid: int) -> bool:
    """Is there a process ``pid`` (whoever's it is)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pidfd(pid: int | None) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits, or None.

    Better than ``multiprocessing``'s sentinel, a pipe the child holds open:
    a job's child inherits that pipe and would hide the worker's death from
    the supervisor for as long as it lives.
    """
    if pid is None or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:  # pragma: no cover - already gone, or no pidfd support
        return None


def signal_group(pid: int | None, sig: int) -> None:
    if pid is None or not hasattr(os, "killpg"):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def is_stopped(pid: int | None) -> bool:
    """Is ``pid`` stopped (SIGSTOP, SIGTSTP, a tracer)? Such a process does
    nothing until resumed: it never sees EOF on its pipe, and SIGTERM waits
    for a SIGCONT. Only SIGKILL ends it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split(None, 1)[0]
    except (OSError, IndexError):
        return False
    return state in (b"T", b"t")


def wait_for_exits(
    channels: list[Any], grace: float, wake_fd: int, hurry: Callable[[], bool], hurried_grace: float
) -> list[Any]:
    """Wait up to ``grace`` seconds for workers to exit on their own (each a
    channel, with the ``sentinel`` and ``pid`` of its process). Returns those
    that did not: the caller kills them.

    In real time, not the core's clock: this waits for processes to exit. A
    stopped process is not waited for (it cannot exit; it is returned at
    once, with the rest). A wake-up on ``wake_fd`` after which ``hurry()`` is
    true (``close(wait=False)`` from another thread) cuts what is left of the
    wait to ``hurried_grace``.
    """
    by_sentinel = {channel.sentinel: channel for channel in channels}
    left = [channel for channel in channels if is_stopped(channel.pid)]
    alive = {channel.sentinel for channel in channels if channel not in left}
    deadline = time.monotonic() + (hurried_grace if hurry() else grace)
    while alive:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        for ready in wait([*alive, wake_fd], remaining):
            if ready is wake_fd:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_fd, 4096):
                        pass
                if hurry():
                    deadline = min(deadline, time.monotonic() + hurried_grace)
            else:
                alive.discard(ready)
    return [*left, *(by_sentinel[sentinel] for sentinel in alive)]
