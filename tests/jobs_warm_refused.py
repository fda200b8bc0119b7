"""A job module that imports only where the lane's env has reached (a
worker), and raises in any other process (the lane's template, which runs
with the forkserver's environment): see test_warm_starts.py."""

from __future__ import annotations

import os

if os.environ.get("PROCQ_TEST_WARM_WORKER") != "1":
    raise ImportError("jobs_warm_refused imports only in a worker")

IMPORTED_IN = os.getpid()


def where() -> tuple[int, int]:
    return os.getpid(), IMPORTED_IN
