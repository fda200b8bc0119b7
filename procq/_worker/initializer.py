"""A lane's initializer, as its workers' starts carry it and its workers run it.

``ProcQueue`` hands a trusted lane's ``initializer`` and ``initargs`` to each
worker as an argument of the worker's start (``multiprocessing``'s
``Process(args=...)``), and to the lane's template the same way, whose forked
workers inherit them. So ``initargs`` are pickled by ``multiprocessing`` while
it starts a process, the one moment it lets its own objects travel (a
``multiprocessing.Queue``, a ``Lock``, an ``Event``: the descriptors they hold
are passed to the child), as ``ProcessPoolExecutor`` pickles its
``initargs``. The initializer itself is pickled as the lane's jobs'
functions are (``_wire.main_ref``): a lambda or a function of a ``python -c``
program is one, and one of the main script shares that module's globals with
the jobs.

In the worker, ``WorkerInit.run`` runs it once as the worker starts, before
READY. One that raises leaves the worker up: its next job fails with
``InitializerFailed`` without running, and the job after that runs the
initializer again first (``WorkerInit.check``).

This module is loaded in a worker only when its lane has an initializer (its
``WorkerInit`` is unpickled there): ``concurrent.futures``, which
``InitializerFailed`` derives from, stays out of other workers.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any

__all__ = ["InitializerFailed", "WorkerInit", "init_fds"]


class InitializerFailed(BrokenProcessPool):
    """A worker's initializer (a lane's ``initializer``, an ``Executor``'s)
    raised, so the job did not run.

    Its message names the initializer and its exception; the job's failure
    carries the traceback, the initializer's included. The worker is kept:
    its next job runs the initializer again first. A ``BrokenProcessPool``
    (and so a ``RuntimeError``), as the stdlib raises for a failing
    initializer, though only this job failed.
    """

    __module__ = "procq"  # its public name, printed and pickled as procq.<name>


class WorkerInit:
    """``initializer(*initargs)``, for a worker to run as it starts."""

    __slots__ = ("error", "initargs", "initializer", "ok")

    def __init__(self, initializer: Callable[..., object], initargs: tuple[Any, ...]) -> None:
        self.initializer = initializer
        self.initargs = initargs
        self.ok = False  # it ran, and returned
        self.error: BaseException | None = None  # what its last run raised, not yet reported

    def __reduce__(self) -> tuple[Any, ...]:
        from procq._wire.main_ref import dumps_shared

        # The arguments stay a tuple, pickled by multiprocessing's own pickler
        # in the same call (what lets its Queue and Lock through).
        return (_rebuild, (dumps_shared(self.initializer), self.initargs))

    def run(self) -> None:
        """Run the initializer; what it raises is kept for the next job."""
        try:
            self.initializer(*self.initargs)
        except BaseException as exc:
            self.error = exc
            self.ok = False
        else:
            self.error = None
            self.ok = True

    def check(self) -> InitializerFailed | None:
        """Before a job: the initializer's failure the job fails with, if it
        failed (at the worker's start, or just now, run again since the last
        failure was reported); None once it has run."""
        if self.ok:
            return None
        if self.error is None:  # the last failure was reported: try again
            self.run()
            if self.ok:
                return None
        exc, self.error = self.error, None
        assert exc is not None
        target = getattr(self.initializer, "__wrapped__", self.initializer)  # (a wrapper names what it wraps)
        name = getattr(target, "__qualname__", None) or repr(target)
        failed = InitializerFailed(
            f"the initializer {name}() failed in worker process {os.getpid()}, so the job did not run "
            f"({type(exc).__name__}: {exc}); the worker's next job runs the initializer again"
        )
        failed.__cause__ = exc
        return failed


def _rebuild(initializer: bytes, initargs: tuple[Any, ...]) -> WorkerInit:
    return WorkerInit(pickle.loads(initializer), initargs)


def init_fds() -> set[int]:
    """The descriptors a worker (or a template) keeps open for its
    initializer's arguments: those ``multiprocessing`` passed with this
    process's start, under the forkserver (a template's worker inherits its
    template's list). A spawned process is a fresh interpreter that holds only
    what it was given: it keeps them all."""
    from multiprocessing import forkserver

    inherited = forkserver.get_inherited_fds()
    if inherited is not None:
        return set(inherited)
    try:
        return {int(name) for name in os.listdir("/proc/self/fd")}
    except OSError:  # pragma: no cover - no /proc: nothing is closed then either
        return set()
