"""The jobs ``bench.chaos`` pushes: one function per way a job can end.

Small and import-light, like ``bench.jobs``: every worker imports it by name."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from typing import Any


def _log(log: str, key: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{key}\n".encode())  # one write of a short line: appends never interleave
    finally:
        os.close(fd)


def ok(log: str, key: str) -> str:
    """Succeeds; each run is logged, so the checker can count executions."""
    _log(log, key)
    return f"out:{key}"


def raises(key: str) -> None:
    raise ValueError(f"{key} raised")


def segfault() -> None:
    ctypes.string_at(0)


def sigkill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def exit_now() -> None:
    os._exit(7)


def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def hog(mib: int) -> int:
    block = bytearray(mib << 20)
    return len(block)


def unpicklable() -> Any:
    return threading.Lock()


def _refuse(key: str) -> Any:
    raise ValueError(f"the result of {key} refuses to be unpickled")


class _RefusesUnpickling:
    def __init__(self, key: str) -> None:
        self.key = key

    def __reduce__(self) -> tuple[Any, ...]:
        return (_refuse, (self.key,))


def bad_unpickle(key: str) -> Any:
    return _RefusesUnpickling(key)


def flaky(log: str, key: str, marker: str) -> str:
    """Fails its first attempt (leaving ``marker``), succeeds after."""
    if not os.path.exists(marker):
        with open(marker, "w"):
            pass
        raise RuntimeError(f"{key}: first attempt fails")
    return ok(log, key)


def big(nbytes: int) -> str:
    return "x" * nbytes


def echo(data: bytes) -> bytes:
    """Returns its (large) argument: in and out through shared memory."""
    return bytes(data)


def sigkill_holding(data: bytes) -> None:
    """Dies holding a large argument."""
    os.kill(os.getpid(), signal.SIGKILL)
