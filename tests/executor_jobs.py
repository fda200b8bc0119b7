"""Job functions for the Executor tests, importable by the workers."""

from __future__ import annotations

import os
import signal
import sys
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


def init_fail(log_queue: Any = None) -> None:
    """CPython's ``init_fail``: log to ``log_queue`` (as the worker's
    ``concurrent.futures`` logger), then fail."""
    if log_queue is not None:
        import logging
        from logging.handlers import QueueHandler

        logger = logging.getLogger("concurrent.futures")
        logger.addHandler(QueueHandler(log_queue))
        logger.setLevel("CRITICAL")
        logger.propagate = False
    time.sleep(0.1)  # let some futures be scheduled
    raise ValueError("error in initializer")


# --- CPython's test_deadlock.py: jobs and objects that fail at each step ----------


def crash(delay: float | None = None) -> None:
    """Induces a segfault."""
    if delay:
        time.sleep(delay)
    import faulthandler

    faulthandler.disable()
    faulthandler._sigsegv()  # type: ignore[attr-defined]


def exit_1() -> None:
    """Induces a sys exit with exitcode 1."""
    sys.exit(1)


def raise_error(err: type[BaseException]) -> None:
    raise err()


def _raise_error_ignore_stderr(err: type[BaseException]) -> None:
    import io

    sys.stderr = io.StringIO()
    raise err()


def return_instance(cls: type[Any]) -> Any:
    return cls()


class CrashAtPickle:
    """Bad object that triggers a segfault at pickling time."""

    def __reduce__(self) -> Any:
        crash()


class CrashAtUnpickle:
    """Bad object that triggers a segfault at unpickling time."""

    def __reduce__(self) -> Any:
        return crash, ()


class ExitAtPickle:
    """Bad object that triggers a process exit at pickling time."""

    def __reduce__(self) -> Any:
        exit_1()


class ExitAtUnpickle:
    """Bad object that triggers a process exit at unpickling time."""

    def __reduce__(self) -> Any:
        return exit_1, ()


class ErrorAtPickle:
    """Bad object that triggers an error at pickling time."""

    def __reduce__(self) -> Any:
        from pickle import PicklingError

        raise PicklingError("Error in pickle")


class ErrorAtUnpickle:
    """Bad object that triggers an error at unpickling time."""

    def __reduce__(self) -> Any:
        from pickle import UnpicklingError

        return _raise_error_ignore_stderr, (UnpicklingError,)


def raise_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


def square_or_crash(x: int) -> int:
    """``x * x``; -1 kills its worker (SIGKILL)."""
    if x == -1:
        os.kill(os.getpid(), signal.SIGKILL)
    return x * x


def raise_error_with(etype: type[BaseException], message: str) -> None:
    raise etype(message)


class ErrorWithMessageAtUnpickle:
    """Bad object whose unpickling raises ``etype(message)``."""

    def __init__(self, etype: type[BaseException], message: str) -> None:
        self.etype = etype
        self.message = message

    def __reduce__(self) -> Any:
        return raise_error_with, (self.etype, self.message)
