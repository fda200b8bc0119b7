"""Jobs whose results and exceptions do things when the supervisor unpickles
them (``multiprocessing.parent_process()`` is None only in the supervisor, so
the worker's own check that an exception unpickles is not disturbed)."""

from __future__ import annotations

import datetime
import multiprocessing
import threading
from typing import Any

#: In the supervisor (the test's process): the threads that ran a ``Recording``'s unpickling.
DECODED_ON: list[str] = []


def _in_supervisor() -> bool:
    return multiprocessing.parent_process() is None


def _rebuild_recording(value: Any) -> Any:
    if _in_supervisor():
        DECODED_ON.append(threading.current_thread().name)
    return value


class Recording:
    """Unpickles to ``value``, noting which thread unpickled it."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_recording, (self.value,))


def result_recording(value: Any) -> Recording:
    return Recording(value)


class PlainError(Exception):
    """A job's own exception class: it unpickles anywhere."""


def raise_plain(message: str) -> None:
    raise PlainError(message)


def _rebuild_refusing(message: str) -> Exception:
    if _in_supervisor():
        raise SystemExit(f"refusing to unpickle {message!r} here")
    return RefusedInSupervisor(message)


class RefusedInSupervisor(Exception):
    """An exception that unpickles in the worker but raises SystemExit in the supervisor."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_refusing, (self.args[0],))


def raise_refused(message: str) -> None:
    raise RefusedInSupervisor(message)


def a_datetime(day: int) -> datetime.datetime:
    return datetime.datetime(2020, 1, day)


def many_ints(n: int) -> list[int]:
    return list(range(n))


def raise_long(n: int) -> None:
    raise ValueError("x" * n)
