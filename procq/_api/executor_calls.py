"""What ``procq.Executor`` sends to its workers: its initializer and a map's chunks.

This module is imported in the worker processes (to unpickle what it
defines), so it imports nothing of the supervisor's side.

An executor's ``initializer`` runs in each worker before the first of the
executor's jobs it runs, a replacement's too (after a crash,
``max_tasks_per_child``), as a fresh ``ProcessPoolExecutor`` worker would:

- in a local trusted lane (the executor's own lanes), it is the lane's
  initializer (``Lane(initializer=...)``): each worker runs it as it starts,
  and ``initargs`` travel with the worker's start, as ``ProcessPoolExecutor``
  passes them, so a ``multiprocessing.Queue`` or ``Lock`` may be one. It is
  wrapped in ``LoggedInitializer``, which logs its exception as
  ``ProcessPoolExecutor``'s workers do (logger ``concurrent.futures``,
  CRITICAL, "Exception in initializer:");
- in any other lane (untrusted, Dask), every job's function travels wrapped
  in an ``Initialized``, with the initializer and its arguments pickled with
  it (so only what pickles goes there), and runs the initializer once per
  process (remembered by the executor's token).

A failing initializer is not fatal to anything but a job: the job fails with
``InitializerFailed`` (a ``BrokenProcessPool``, naming the initializer, with
its exception in the traceback) without running, the worker stays up, and
its next job runs the initializer again first. (``ProcessPoolExecutor``
instead breaks the whole pool, failing every pending future with
``BrokenProcessPool``; procq keeps a failure to the job it happened in.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from procq._wire.main_ref import dumps_shared
from procq._worker.initializer import InitializerFailed, WorkerInit

__all__ = ["Initialized", "InitializerFailed", "LoggedInitializer", "run_chunk"]

_LOG = logging.getLogger("concurrent.futures")

#: Per executor (its token), its initializer as this process runs it: run
#: before the executor's first job here, again before the next after a failure.
_inits: dict[str, WorkerInit] = {}


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
        init = _inits.get(self.token)
        if init is None:
            init = _inits[self.token] = WorkerInit(LoggedInitializer(self.initializer), self.initargs)
        failed = init.check()  # (as a lane's worker checks before each job: see _worker.initializer)
        if failed is not None:
            raise failed
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Initialized {self.fn!r}>"


class LoggedInitializer:
    """An executor's initializer as its lanes run it: what it raises is
    logged as ``ProcessPoolExecutor``'s workers log it, then raised on (the
    worker fails its next job with it)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., object]) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> None:
        try:
            self.fn(*args)
        except BaseException:
            _LOG.critical("Exception in initializer:", exc_info=True)
            raise

    def __reduce__(self) -> tuple[Any, ...]:
        # The function as the lane's jobs travel (a main script's by name: see _wire.main_ref).
        return (_logged, (dumps_shared(self.fn),))

    @property
    def __wrapped__(self) -> Callable[..., object]:  # (how a failure names it: see WorkerInit.check)
        return self.fn


def _logged(fn: bytes) -> LoggedInitializer:
    import pickle

    return LoggedInitializer(pickle.loads(fn))


def run_chunk(fn: Callable[..., Any], chunk: list[tuple[Any, ...]]) -> list[Any]:
    """A chunk of ``Executor.map``: ``fn(*args)`` for each argument tuple, in the worker."""
    return [fn(*args) for args in chunk]
