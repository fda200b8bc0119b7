"""Initializers and jobs for tests/test_lane_initializer.py (importable by workers)."""

from __future__ import annotations

import os
import signal
from typing import Any

#: What this worker's initializer set up (the jobs read it).
STATE: dict[str, Any] = {}


def announce(log: Any, starts: Any, tag: str) -> None:
    """Count this start in a shared ``Value`` and say so on a ``multiprocessing.Queue``.

    The queue is closed and its feeder thread joined here, so the message is
    written before the worker takes a job (one that SIGKILLs the worker would
    otherwise lose what the feeder still held)."""
    with starts.get_lock():
        starts.value += 1
    STATE["tag"] = tag
    log.put(("started", os.getpid()))
    log.close()
    log.join_thread()


def where() -> tuple[int, str | None]:
    """This worker's pid and the tag its initializer set."""
    return os.getpid(), STATE.get("tag")


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def fails_first(attempts: Any) -> None:
    """Fail this process's first attempt, succeed at its second."""
    with attempts.get_lock():
        attempts.value += 1
    STATE["tries"] = STATE.get("tries", 0) + 1
    if STATE["tries"] == 1:
        raise ConnectionError("the database is not up yet")
    STATE["tag"] = "ready"


def exit_now() -> None:
    os._exit(7)


def where_tag() -> str | None:
    return STATE.get("tag")
