"""Job functions and payloads for test_crashes, test_processes and test_model.

Everything a worker must unpickle lives here, in a small importable module: the
crash and pickling rows of the crash table, gated jobs that report their pid
before they act, and the job the state-machine model runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jobs

# --- Gated and reporting jobs ------------------------------------------------------


def report_pid_then(started: str, action: Callable[..., Any], *args: Any) -> Any:
    """Tell the test this worker's pid on ``started``, then run ``action(*args)``."""
    jobs.signal_test(started, str(os.getpid()).encode())
    return action(*args)


def report_pid_wait_then(started: str, go: str, action: Callable[..., Any], *args: Any) -> Any:
    """Report the pid on ``started``, wait for ``go``, then run ``action(*args)``."""
    jobs.signal_and_wait(started, go)
    return action(*args)


def pid_and_ancestors() -> tuple[int, list[int]]:
    """This process's pid and the pids of its ancestors, nearest first."""
    import psutil

    return os.getpid(), [p.pid for p in psutil.Process().parents()]


def hold_with_grandchild(report: str, gate: str) -> None:
    """Start a child process, write ``"<my pid> <child pid>"`` to the regular file
    ``report`` (atomically), then block on the FIFO ``gate`` until killed.

    The child blocks on ``gate`` as well: only a kill of the job's whole process
    tree ends it.
    """
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; open(sys.argv[1], 'rb').read(1)", gate],
    )
    tmp = report + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.replace(tmp, report)
    jobs.wait_released(gate)


# --- Ways for a job to end ----------------------------------------------------------


def raise_system_exit(code: int) -> None:
    raise SystemExit(code)


def raise_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


def return_lock() -> Any:
    return threading.Lock()


def return_generator() -> Iterator[int]:
    return (i for i in range(3))


class LockedError(Exception):
    """An exception whose instance holds a lock: it cannot be pickled."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def raise_locked(message: str) -> None:
    raise LockedError(message)


def _refuse_load(what: str) -> None:
    raise RuntimeError(f"{what} refuses to be unpickled")


class UnloadableValue:
    """Pickles anywhere; unpickling it raises RuntimeError, in any process."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_refuse_load, ("UnloadableValue",))


def return_unloadable() -> UnloadableValue:
    return UnloadableValue()


def _load_homesick(home: int, message: str) -> HomesickError:
    if os.getpid() != home:
        raise RuntimeError(f"HomesickError refuses to be unpickled outside process {home}")
    return HomesickError(message, home)


class HomesickError(Exception):
    """Pickles anywhere, but unpickles only in the process that raised it.

    The worker's own trial unpickling succeeds, so only the supervisor fails.
    """

    def __init__(self, message: str, home: int | None = None) -> None:
        super().__init__(message)
        self.home = os.getpid() if home is None else home

    def __reduce__(self) -> tuple[Any, ...]:
        return (_load_homesick, (self.home, self.args[0]))


def raise_homesick(message: str) -> None:
    raise HomesickError(message)


class UnloadableFn:
    """A callable that pickles, but cannot be unpickled in the worker."""

    def __call__(self) -> int:  # pragma: no cover - never gets to run
        return 1

    def __reduce__(self) -> tuple[Any, ...]:
        return (_refuse_load, ("UnloadableFn",))


class LockedFn:
    """A callable holding a lock: it cannot be pickled at all."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self) -> int:  # pragma: no cover - never gets to run
        return 1


# --- The state-machine model's job ------------------------------------------------


def model_job(behaviour: str, token: str, started: str | None = None, go: str | None = None) -> str:
    """Optionally wait at a gate, then return ``token``, raise, or crash."""
    if started is not None and go is not None:
        jobs.signal_and_wait(started, go)
    if behaviour == "ok":
        return token
    if behaviour == "raise":
        raise ValueError(token)
    assert behaviour == "crash", behaviour
    os._exit(5)
