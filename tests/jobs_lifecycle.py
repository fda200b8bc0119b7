"""Job functions for the key lifecycle tests (retention, reuse, retries, batches, map).

Attempts are counted in files: ``attempt(counter)`` appends one byte to the
file ``counter`` and returns how many attempts there have been, so a job can
fail its first attempts and a test can count how many ran.
"""

from __future__ import annotations

import os
from typing import Any


def attempt(counter: str) -> int:
    fd = os.open(counter, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x")
    finally:
        os.close(fd)
    return os.path.getsize(counter)


def attempts(counter: str) -> int:
    """(In the test) how many attempts ran."""
    try:
        return os.path.getsize(counter)
    except FileNotFoundError:
        return 0


def flaky(counter: str, fails: int, how: str = "raise", value: Any = "ok") -> Any:
    """Fail the first ``fails`` attempts (raise ValueError, or exit the
    worker with code 7), then return ``value``."""
    n = attempt(counter)
    if n <= fails:
        if how == "crash":
            os._exit(7)
        raise ValueError(f"attempt {n} failed")
    return value


def counted(counter: str, value: Any) -> Any:
    """Count the run, return ``value``."""
    attempt(counter)
    return value


def double(x: int) -> int:
    return 2 * x


def fail_on_odd(x: int) -> int:
    if x % 2:
        raise ValueError(f"odd: {x}")
    return x
