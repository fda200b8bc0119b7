"""What ``procq.Executor`` sends to its workers: its initializer's wrapper and a map's chunks.

This module is imported in the worker processes (to unpickle the wrapper),
so it imports nothing of the supervisor's side.

An executor's ``initializer`` runs in each worker before the first of that
executor's jobs the worker runs: every job's function travels wrapped in an
``Initialized``, which runs the initializer once per process (remembered by
the executor's token) and then the function. Why a wrapper rather than a
lane setting: it needs nothing from the engine, it holds for any lane the
executor's jobs run in, and a worker that procq replaces (a crash,
``max_tasks_per_child``) runs the initializer again before its next job, as
a fresh ``ProcessPoolExecutor`` worker would.

A failing initializer is not fatal to anything but the job it ran for: that
job fails with ``InitializerFailed`` (naming the initializer, with its
exception as the cause) and the worker stays up; the worker's next job of
the executor runs the initializer again. (``ProcessPoolExecutor`` instead
breaks the whole pool, failing every pending future with
``BrokenProcessPool``; procq keeps a failure to the job it happened in.)
``InitializerFailed`` is a ``BrokenProcessPool``, so code written for
``ProcessPoolExecutor`` catches it where it caught that, and the worker logs
the initializer's exception as ``ProcessPoolExecutor``'s workers do (logger
``concurrent.futures``, CRITICAL, "Exception in initializer:").

The initializer and its arguments travel pickled with each job (cloudpickle),
not at the worker's start: what only ``multiprocessing``'s process start
may pass (a ``multiprocessing.Queue``, a ``Lock``) cannot be an ``initargs``
here; a ``Manager()``'s queue can.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any

__all__ = ["Initialized", "InitializerFailed", "run_chunk"]

#: The tokens of the executors whose initializer has run in this process.
_initialized: set[str] = set()


class InitializerFailed(BrokenProcessPool):
    """An ``Executor``'s ``initializer`` raised in a worker, so the job did not run.

    The initializer's own exception is the ``__cause__``. The worker is kept;
    its next job of the same executor runs the initializer again. A
    ``BrokenProcessPool`` (and so a ``RuntimeError``), as the stdlib raises for
    a failing initializer, though only this job failed.
    """


class Initialized:
    """``fn``, run after ``initializer(*initargs)`` has run once in this process."""

    __slots__ = ("fn", "initargs", "initializer", "token")

    def __init__(self, fn: Callable[..., Any], initializer: Callable[..., Any], initargs: tuple[Any, ...], token: str):
        self.fn = fn
        self.initializer = initializer
        self.initargs = initargs
        self.token = token

    def __getstate__(self) -> tuple[Any, ...]:
        return (self.fn, self.initializer, self.initargs, self.token)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.fn, self.initializer, self.initargs, self.token = state

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.token not in _initialized:
            try:
                self.initializer(*self.initargs)
            except Exception as exc:
                logging.getLogger("concurrent.futures").critical("Exception in initializer:", exc_info=True)
                name = getattr(self.initializer, "__qualname__", repr(self.initializer))
                raise InitializerFailed(
                    f"the executor's initializer {name}() failed in worker process {os.getpid()}, so the job did "
                    f"not run ({type(exc).__name__}: {exc}); the worker's next job runs the initializer again"
                ) from exc
            _initialized.add(self.token)
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Initialized {self.fn!r}>"


def run_chunk(fn: Callable[..., Any], chunk: list[tuple[Any, ...]]) -> list[Any]:
    """A chunk of ``Executor.map``: ``fn(*args)`` for each argument tuple, in the worker."""
    return [fn(*args) for args in chunk]
