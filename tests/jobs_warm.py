"""Jobs for test_warm_starts.py, in a module no test imports at its top: a
worker imports it as it unpickles the first job that names it, and notes in
which process that import ran (``IMPORTED_IN``): its own, or the lane
template's it was forked from."""

from __future__ import annotations

import os
import signal

IMPORTED_IN = os.getpid()


def where() -> tuple[int, int]:
    """This worker's pid, and the pid of the process that imported this module."""
    return os.getpid(), IMPORTED_IN


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
