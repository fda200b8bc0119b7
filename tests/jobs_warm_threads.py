"""A job module that starts a thread as it is imported: see test_warm_starts.py."""

from __future__ import annotations

import os
import threading

_idle = threading.Event()
threading.Thread(target=_idle.wait, name="jobs-warm-threads", daemon=True).start()

IMPORTED_IN = os.getpid()


def where() -> tuple[int, int]:
    return os.getpid(), IMPORTED_IN
