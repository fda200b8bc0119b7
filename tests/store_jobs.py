"""Job functions for the store tests (workers import this module)."""

from __future__ import annotations

import os
import time


def counted(log: str, value: object, work: float = 0.0) -> object:
    """Append a line to ``log`` (one per execution), work ``work`` seconds, return ``value``."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{value} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    if work:
        time.sleep(work)  # the job's work, not a wait for anything
    return value


def fails(log: str) -> None:
    counted(log, "fails")
    raise ValueError("this job fails")


def echo(value: object) -> object:
    return value


def big(started: str, go: str, size: int) -> bytes:
    """Signal ``started``, wait at ``go``, return ``size`` bytes (more than a page of the store)."""
    from jobs import signal_and_wait

    signal_and_wait(started, go)
    return b"x" * size


def stamped(log: str, key: str, work: float) -> str:
    """Append ``key`` and a fresh run id to ``log`` (one line per execution),
    work ``work`` seconds, return the run id: each execution's own output."""
    run = f"{os.getpid()}-{time.monotonic_ns()}"
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{key} {run}\n".encode())
    finally:
        os.close(fd)
    if work:
        time.sleep(work)  # the job's work, not a wait for anything
    return run


def sized(size: int) -> bytes:
    """``size`` bytes that differ along their length (a piece out of place shows)."""
    counting = b"".join(i.to_bytes(4, "little") for i in range(size // 4 + 1))
    return counting[:size]
