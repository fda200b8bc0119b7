"""Job functions for the state, race, lane and API tests.

They report from inside the child: each appends one line to a log file opened
with O_APPEND (one ``os.write`` per line, so lines from concurrent children
never interleave), which lets a test count how many times a job really ran and
in which process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jobs


def log_line(log: str, text: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)


def record(log: str, tag: str = "ran") -> int:
    """Append ``"<tag> <pid>"`` to ``log``; return the pid."""
    pid = os.getpid()
    log_line(log, f"{tag} {pid}")
    return pid


def record_and_wait(log: str, go: str, tag: str = "ran") -> int:
    """Append ``"<tag> <pid>"`` to ``log``, then wait for the test to release ``go``."""
    pid = record(log, tag)
    jobs.wait_released(go)
    return pid


def record_signal_wait(log: str, started: str, go: str, tag: str = "ran") -> int:
    """Append ``"<tag> <pid>"`` to ``log``, send the pid on ``started``, wait for ``go``."""
    pid = record(log, tag)
    jobs.signal_test(started, str(pid).encode())
    jobs.wait_released(go)
    return pid


def pid_and(value: Any) -> tuple[int, Any]:
    return os.getpid(), value


def apply(fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn`` (which travelled as an argument) in the child; return its result and the pid."""
    return fn(*args), os.getpid()


def boom_logged(log: str, message: str) -> None:
    record(log, "boom")
    raise ValueError(message)


def signal_wait_boom(started: str, go: str, message: str) -> None:
    """Send the pid on ``started``, wait for ``go``, then raise ValueError(message)."""
    jobs.signal_test(started, str(os.getpid()).encode())
    jobs.wait_released(go)
    raise ValueError(message)
