"""Task functions for test_joblib: what joblib's batches call in procq's workers."""

from __future__ import annotations

import fcntl
import os
import signal
import threading
import time
from pathlib import Path

import joblib


def square_and_pid(i: int) -> tuple[int, int]:
    return i * i, os.getpid()


def crash_at(i: int, at: int, signum: int) -> int:
    """``i``, except for item ``at``, whose worker kills itself with ``signum``."""
    if i == at:
        os.kill(os.getpid(), signum)
    return i


def raise_at(i: int, at: int) -> int:
    if i == at:
        raise ValueError(f"item {i} is bad")
    return i


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _add(path: Path, delta: int) -> int:
    """Add ``delta`` to the running count in ``path`` (under a file lock); the new count.
    The file holds "running max" and keeps the highest count seen."""
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        running, high = (int(n) for n in (f.read().split() or ["0", "0"]))
        running += delta
        f.seek(0)
        f.truncate()
        f.write(f"{running} {max(high, running)}")
        return running


def counted(path: str, seconds: float) -> int:
    """Count itself as running in ``path`` for ``seconds``: the file's second
    number ends as the most tasks that ran at once."""
    _add(Path(path), 1)
    try:
        time.sleep(seconds)
    finally:
        _add(Path(path), -1)
    return os.getpid()


def _inner(j: int) -> tuple[int, int, str]:
    return j, os.getpid(), threading.current_thread().name


def nested(i: int) -> tuple[str, list[tuple[int, int, str]]]:
    """A ``Parallel`` inside a batch: which backend it got, and where its tasks ran."""
    backend, _ = joblib.parallel.get_active_backend()
    return type(backend).__name__, joblib.Parallel(n_jobs=2)(joblib.delayed(_inner)(j) for j in range(4))


SIGNALS = {"SIGSEGV": signal.SIGSEGV, "SIGKILL": signal.SIGKILL}


def raise_base(name: str) -> None:
    raise {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt}[name]()


def procq_parallel_here() -> tuple[list[int], list[str]]:
    """A procq ``Parallel`` run in this process (a pool's worker): its results
    and the warnings it gave."""
    import warnings

    import procq.joblib  # noqa: F401  (registers "procq" in this process)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = joblib.Parallel(n_jobs=2, backend="procq")(joblib.delayed(abs)(-i) for i in range(4))
    return out, [f"{w.category.__name__}: {w.message}" for w in caught]


#: Set in each worker by ``remember_init``.
INIT: list[object] = []


def remember_init(value: object) -> None:
    INIT.append(value)


def init_seen(_: int) -> tuple[int, list[object]]:
    return os.getpid(), list(INIT)


def write_into_memmap(path: str, i: int) -> None:
    """The pattern that works under any backend: open the file here, write, flush."""
    import numpy as np

    array = np.memmap(path, dtype="float64", mode="r+", shape=(4,))
    array[i] = i * 10.0
    array.flush()


def open_a_queue_here() -> str:
    """What opening a ProcQueue in this process (a loky worker) says."""
    from procq import ProcQueue

    try:
        with ProcQueue(1):
            return "opened"
    except RuntimeError as exc:
        return str(exc)


class HoldsALock(Exception):
    """An exception that cannot be pickled to come back from its worker."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.lock = threading.Lock()


def raise_unpicklable_at(i: int, at: int) -> int:
    if i == at:
        raise HoldsALock(f"item {i} holds a lock")
    return i


def pid(_: int) -> int:
    return os.getpid()
