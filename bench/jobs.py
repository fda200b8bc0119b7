"""The functions the benchmark's workers run, for every engine alike.

They live in a small module that imports nothing heavy, so every engine's
workers import them by reference (the job carries only a name).
"""

from __future__ import annotations

import os
import signal
import time


def noop() -> None:
    return None


def inc(x: int) -> int:
    return x + 1


def nap(seconds: float) -> int:
    """Sleep, then say which worker ran this (the warm-up counts them)."""
    time.sleep(seconds)
    return os.getpid()


def spin(n: int) -> float:
    """Pure-Python CPU work; returns how long it ran, measured in the worker."""
    t0 = time.perf_counter()
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFFFFFF
    return time.perf_counter() - t0


def blob(nbytes: int) -> bytes:
    """A result of ``nbytes`` bytes (zeros: making it costs a memset)."""
    return bytes(nbytes)


def stamp_and_die(path: str) -> None:
    """Write ``time.monotonic()`` to ``path``, then SIGKILL this worker.

    CLOCK_MONOTONIC is one clock for every process on Linux, so the waiter can
    subtract this stamp from the moment it is told."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, repr(time.monotonic()).encode())
    os.close(fd)
    die()


def die() -> None:
    """SIGKILL this worker."""
    os.kill(os.getpid(), signal.SIGKILL)


def exit_now() -> None:
    """End this process at once, running nothing more (a bare child's whole life)."""
    os._exit(0)


def double_or_die(i: int, path: str) -> int:
    """``2 * i``; but when ``path`` is not empty, stamp it and SIGKILL this worker."""
    if path:
        stamp_and_die(path)
    return 2 * i


def now() -> float:
    """``time.monotonic()`` as the job starts (one clock for every process on Linux)."""
    return time.monotonic()
