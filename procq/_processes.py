"""Worker processes as the supervisor sees them: starting an untrusted one,
telling its death, measuring its memory, signalling its tree.

Everything here is a plain function of a pid or a process object; the
process channels (``_channel``) call them when the I/O thread (``_supervisor``)
says. On Linux a worker's death is watched through a pidfd, its tree found
through ``/proc`` (psutil), and its memory read from ``/proc/<pid>/statm``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from typing import Any

from procq._job import Lane
from procq._privileges import untraceable

__all__ = [
    "ExecProcess",
    "children_map",
    "describe_exit",
    "find_descendants",
    "import_path",
    "pidfd",
    "process_rss",
    "signal_group",
    "tree_rss",
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
    """Parent pid -> child pids, for every process, from one scan."""
    children: dict[int, list[int]] = {}
    try:
        import psutil

        for proc in psutil.process_iter(["ppid"]):
            children.setdefault(proc.info["ppid"], []).append(proc.pid)
    except Exception:  # pragma: no cover - /proc unreadable
        pass
    return children


def tree_rss(pid: int, children: dict[int, list[int]]) -> int:
    """Resident memory of ``pid`` and every process below it."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += process_rss(current)
        todo.extend(children.get(current, ()))
    return total


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
