"""The jobs ``bench.faults`` runs: a healthy one and two ways for a worker to die.

Import-light, like ``bench.chaos_jobs``: every worker imports it by name."""

from __future__ import annotations

import ctypes
import os
import signal
import time


def healthy(n: int) -> int:
    time.sleep(0.02)
    return n * n


def sigkill(n: int) -> int:
    time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGKILL)
    return n


def segfault(n: int) -> int:
    time.sleep(0.02)
    ctypes.string_at(0)
    return n
