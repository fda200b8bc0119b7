"""Job functions for the Executor tests, importable by the workers."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

#: Set by ``remember`` in a worker: what its initializer was given.
INITIALIZED: list[Any] = []


def mul(x: int, y: int) -> int:
    return x * y


def capture(*args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return args, kwargs


def remember(value: Any) -> None:
    INITIALIZED.append(value)


def initialized() -> list[Any]:
    return INITIALIZED


def fail_init() -> None:
    raise OSError("no database here")


def wait_for_file(path: str, timeout: float = 30.0) -> None:
    """Block until ``path`` exists (a test's go signal, across processes)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.005)


def wait_and_raise(path: str) -> None:
    wait_for_file(path)
    raise Exception("this is an exception")


def segfault() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def getpid() -> int:
    return os.getpid()


class MyObject:
    def my_method(self) -> None:
        pass


def make_dummy_object(_: Any) -> MyObject:
    return MyObject()
