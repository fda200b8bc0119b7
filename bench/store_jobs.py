"""Job functions of the store benchmark (workers import them by reference)."""

from __future__ import annotations

import os
import time


def noop() -> None:
    return None


def ended_at() -> float:
    """The wall time the job ended (a tiny job whose output says when)."""
    return time.time()


def stamp_when_released(fifo: str) -> float:
    """Block until a byte arrives on ``fifo``, then return the wall time the job ended."""
    fd = os.open(fifo, os.O_RDONLY)
    try:
        os.read(fd, 1)
    finally:
        os.close(fd)
    return time.time()
