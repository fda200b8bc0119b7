"""``procq.joblib``: a joblib backend that runs ``Parallel`` batches as procq jobs.

Importing this module registers the backend under the name ``"procq"`` (joblib
has no entry point for backends, so the import is what makes the name known)::

    import joblib
    import procq.joblib  # registers backend="procq"

    with joblib.parallel_config(backend="procq", n_jobs=4):
        scores = cross_val_score(model, X, y, cv=5, n_jobs=4)  # or Parallel(...)(...)

What it gives over joblib's default (loky): every batch runs in a procq worker
that the supervisor watches, and a worker that dies (segfault, SIGKILL, the
kernel's OOM killer) fails only the batch it held, with ``JobFailed`` naming the
signal (``failure.kind == "crashed"``). joblib then raises that error from
``Parallel(...)``: joblib ends the whole call at the first failing batch, for
every backend, so the other batches' results are dropped; that is joblib's
rule, not procq's, and joblib then asks the backend to abort the call's other
batches: here, waiting ones are dropped and running ones' workers killed and
replaced (loky kills its workers too). What differs from loky is the error and
what it means. loky reports a dead worker as ``TerminatedWorkerError``, a
broken executor that it shuts down and rebuilds before the next call; the error
names the signal but not which task died. procq reports the batch that died
(its key, the signal, the worker's pid), the queue is never broken, and a
managed backend (``with Parallel(...) as p``) goes on with the same queue.

Each batch joblib dispatches is one procq job with a key of its own,
``"joblib:<token>:<n>"``, forgotten once its result is handed to joblib, so a
long run keeps nothing per finished batch. ``n_jobs`` is the number of worker
processes (``-1``: one per CPU, as in joblib). ``n_jobs=1`` makes joblib run
the batches in the calling process, as it does for every backend: there is no
worker and so no isolation then.

Options, as ``parallel_config(backend="procq", ...)`` keywords:

- ``timeout``: seconds a batch may run in its worker before it is killed and
  fails (``failure.kind == "timeout"``). It limits a batch, which may hold
  several tasks (joblib sizes batches itself; ``Parallel(batch_size=1)`` makes
  it per task). Not joblib's own ``Parallel(timeout=...)``, which still works.
- ``memory_limit``: bytes or ``"512M"``: a batch whose worker grows past it is
  killed and fails (``"memory"``).
- ``retry``: a ``procq.Retry``, applied to each batch.
- ``start_method``: ``"forkserver"`` or ``"spawn"`` (procq's default otherwise).
- ``inner_max_num_threads``: the thread count for OpenMP, BLAS and the like in
  the workers, as for loky; by default each worker gets ``cpu_count // n_jobs``
  unless the variable is already set.
- ``initializer``, ``initargs``: run once in each worker before its first
  batch (``Parallel(initializer=..., initargs=...)`` takes their place for
  its call). They are the lane's (``Lane(initializer=...)``): they travel
  with each worker's start, so ``initargs`` may hold a ``multiprocessing``
  ``Queue`` or ``Lock``, and a failing one fails the next batch of its
  worker with ``procq.InitializerFailed``.

A task's own exception is raised as itself, ``KeyboardInterrupt`` and
``SystemExit`` included. Where procq cannot start workers, a call runs in the
calling process with a ``UserWarning``, as joblib's process backends do: in a
daemonic process, and in a loky worker (see ``_cannot_start``). joblib's
memory-mapping of large arrays (``max_nbytes``, ``mmap_mode``) is its own
backends' and is not done here: a batch travels as a job's argument, so its
large arrays go through procq's shared memory (docs/how-it-works.md), mapped
by the worker without a copy.

The workers outlive the ``Parallel`` call, as loky's reusable executor's do:
the backend keeps one ``ProcQueue`` for the process, opened at the first
batch a call sends (a call that sends none, say ``n_jobs=1`` or an empty
iterable, starts no worker), and the next call with the same settings (worker
count, initializer and its arguments, thread limits, ``timeout``,
``memory_limit``, ``start_method``) runs on the same workers, which have
already imported what its tasks need. A call with other settings closes it
and opens another; if another call is still running on it, the new call gets
a queue of its own, closed when it ends. The shared queue is closed when the
interpreter exits (before its non-daemon threads are joined), or by
``procq.joblib.shutdown()``.

Thread limits: ``inner_max_num_threads`` (default ``cpu_count() // n_jobs``,
unless the variable is set in this process) is set in each worker's
environment, for the native libraries it loads later, and, with
``threadpoolctl`` (in procq's ``joblib`` extra), applied to those it has
loaded already (those the forkserver or the lane's template imported, numpy
in a script that imports it at its top) before its first batch.

A batch that cannot be pickled fails the call with the pickling error
(``procq.JobPicklingError``, a ``pickle.PicklingError``), wherever joblib
dispatched it from (the first batches from the caller's thread, the later
ones from this backend's callback thread). A task's exception that cannot be
pickled in the worker comes back as ``procq.joblib.UnpicklableTaskError``, a
``concurrent.futures.process.BrokenProcessPool`` (what loky raises then) and
a ``JobFailed``, with the original exception's text.

joblib's completion callbacks run on a thread of this backend, never on
procq's I/O thread: joblib's callback dispatches the next batch (pickling it)
and, after an error, cancels the rest, and procq asks its own callbacks not to
block. Nested ``Parallel`` calls inside a batch use joblib's threading backend
one level down and its sequential backend below that, as loky's workers do.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import pickle
import queue
import secrets
import threading
import warnings
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import joblib
from joblib._parallel_backends import (
    AutoBatchingMixin,
    FallbackToBackend,
    ParallelBackendBase,
    SequentialBackend,
    ThreadingBackend,
)

from procq._api.config import preload_also
from procq._api.executor_calls import LoggedInitializer
from procq._api.handle import JobHandle
from procq._api.outcomes import Queued
from procq._api.queue import ProcQueue
from procq._api.shared_queue import SharedQueue, same_settings
from procq._model.errors import JobFailed
from procq._model.job import Job, Lane
from procq._model.policies import Retry
from procq._worker.thread_limits import apply_thread_limits, thread_limits

__all__ = ["NAME", "ProcqBackend", "UnpicklableTaskError", "register", "shutdown"]

#: The name ``parallel_config(backend=...)`` and ``Parallel(backend=...)`` know it by.
NAME = "procq"

#: A lane's capacity: joblib bounds what it dispatches (``pre_dispatch``), so a
#: push never waits for room (it may run on the callback thread).
_UNBOUNDED = 2**62

LOGGER = logging.getLogger("procq")


class _Callbacks:
    """One thread that runs joblib's completion callbacks, in the order the batches ended.

    procq calls a handle's done callbacks on whichever thread ended the job,
    often its I/O thread, and they must not block; joblib's callback pickles
    and pushes the next batch, or cancels every other batch after an error.
    So a done callback only puts the handle here."""

    def __init__(self) -> None:
        self._inbox: queue.SimpleQueue[tuple[Callable[[], object], str] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="procq-joblib-callbacks", daemon=True)
        self._thread.start()

    def put(self, call: Callable[[], object], what: str) -> None:
        self._inbox.put((call, what))

    def stop(self) -> None:
        """Run what is queued, then end the thread (not waited for from the thread itself)."""
        self._inbox.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        while (item := self._inbox.get()) is not None:
            call, what = item
            try:
                call()
            except Exception:
                LOGGER.exception("exception in joblib's callback for %s", what)


class UnpicklableTaskError(JobFailed, BrokenProcessPool):
    """A task raised an exception that could not be pickled in its worker to
    come back: a ``BrokenProcessPool``, as loky raises then, and a
    ``JobFailed`` (``failure`` holds the exception's type, text and
    traceback). The workers are not broken: the next call runs as usual."""


#: The process's one reusable queue (see the module docstring).
_SHARED = SharedQueue("joblib")


def shutdown() -> None:
    """Close the backend's shared queue (its workers stop); the next
    ``Parallel`` call opens another. Done at interpreter exit."""
    _SHARED.shutdown()


class _Unsent:
    """A batch that could not be pushed (it did not pickle): handed to
    joblib's callback like a batch that ended, and raising the error when
    joblib retrieves its result, so the call fails at once whichever thread
    dispatched it."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class ProcqBackend(AutoBatchingMixin, ParallelBackendBase):  # type: ignore[misc]  # (joblib is untyped)
    """joblib's ``ParallelBackendBase`` over a ``ProcQueue``: each batch is a procq job.

    Made by joblib from ``parallel_config(backend="procq", **options)``; see the
    module docstring for the options and for what a crash does.
    """

    supports_retrieve_callback = True
    supports_inner_max_num_threads = True
    supports_sharedmem = False
    uses_threads = False

    def __init__(
        self,
        nesting_level: int | None = None,
        inner_max_num_threads: int | None = None,
        *,
        timeout: float | None = None,
        memory_limit: int | str | None = None,
        retry: Retry | None = None,
        start_method: str | None = None,
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
    ) -> None:
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads)
        # Checked now, when parallel_config is entered, not at the first batch:
        Lane(timeout=timeout, memory_limit=memory_limit)
        Job("check", int, retry=retry)
        _check_initializer(initializer, initargs)
        self._timeout, self._memory_limit, self._retry = timeout, memory_limit, retry
        self._start_method = start_method
        self._initializer, self._initargs = initializer, initargs
        self._token = secrets.token_hex(6)
        self._counter = itertools.count(1)
        self._queue: ProcQueue | None = None  # acquired at the first batch (under _lock), released at terminate
        self._settings: tuple[Any, ...] | None = None  # what configure asked for: None, not configured
        self._env: dict[str, str] = {}
        self._callbacks: _Callbacks | None = None
        self._lock = threading.Lock()
        self._live: dict[str, JobHandle[Any]] = {}  # batches pushed and not ended (what an abort cancels)

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        """How many workers ``n_jobs`` means: ``-1`` all CPUs, ``-2`` all but one,
        and so on; 1, with a ``UserWarning`` as joblib's process backends give,
        where this process cannot start procq's workers (see ``_cannot_start``)."""
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None:
            return 1
        why = _cannot_start()
        if why is not None:
            if n_jobs != 1:
                warnings.warn(f"procq-backed parallel loops cannot {why}, setting n_jobs=1", UserWarning, stacklevel=3)
            return 1
        if n_jobs < 0:
            return max((os.cpu_count() or 1) + 1 + n_jobs, 1)
        return n_jobs

    def configure(
        self,
        n_jobs: int | None = 1,
        parallel: Any = None,
        prefer: Any = None,
        require: Any = None,
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
        **_: Any,
    ) -> int:
        """Settle the settings of a ``Parallel`` call; the queue is acquired at
        its first batch (see the module docstring); ``n_jobs == 1`` falls back to
        joblib's sequential backend. ``Parallel(initializer=..., initargs=...)``
        takes the place of the ``parallel_config`` ones. (joblib's other options,
        ``max_nbytes``, ``mmap_mode`` and ``temp_folder``, belong to its own
        memory-mapping, which procq does not do: see docs/ecosystem.md.)"""
        workers = self.effective_n_jobs(n_jobs)
        if workers == 1:
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        self.parallel = parallel
        if initializer is None:
            initializer, initargs = self._initializer, self._initargs
        else:
            _check_initializer(initializer, initargs)
        env = self._prepare_worker_env(n_jobs=workers)
        settings = (
            initializer,
            initargs,
            workers,
            tuple(sorted(env.items())),
            self._timeout,
            self._memory_limit,
            self._start_method,
        )
        if self._settings is not None and not same_settings(self._settings, settings):
            self._release()
        self._settings, self._env = settings, env
        return workers

    def _lane(self) -> Lane:
        assert self._settings is not None
        initializer, initargs, workers = self._settings[:3]
        return Lane(
            workers=workers,
            capacity=_UNBOUNDED,
            timeout=self._timeout,
            memory_limit=self._memory_limit,
            env=self._env,
            initializer=None if initializer is None else LoggedInitializer(initializer),
            initargs=initargs if initializer is not None else (),
        )

    def _acquire(self) -> tuple[ProcQueue, _Callbacks]:
        """The call's queue and callback thread, acquired at its first batch."""
        with self._lock:
            if self._queue is None or self._callbacks is None:
                if self._settings is None:
                    raise RuntimeError("the procq joblib backend is not configured (or was terminated)")
                self._queue = _SHARED.acquire(self._settings, self._lane, self._start_method)
                self._callbacks = _Callbacks()
            return self._queue, self._callbacks

    def submit(self, func: Callable[[], Any], callback: Callable[[Any], object] | None = None) -> Any:
        """Push one batch as a job; ``callback(handle)`` runs on the callback thread once it ends."""
        q, callbacks = self._acquire()
        key = f"joblib:{self._token}:{next(self._counter)}"
        try:
            # The batch as the job's argument, not its function: arguments are
            # pickled with their large arrays out of band, through shared memory.
            batch = _Batch(func, thread_limits(self._env))
            outcome = q.push(Job(key, _run_batch, args=(batch,), lane="joblib", retry=self._retry))
        except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as exc:
            # (joblib dispatches later batches from the callback thread, where
            # a raise would be lost and the call would wait for ever.)
            unsent = _Unsent(exc)
            if callback is not None:
                callbacks.put(lambda: callback(unsent), key)
            return unsent
        assert isinstance(outcome, Queued)  # (a fresh key)
        handle = outcome.handle
        with self._lock:
            self._live[key] = handle

        def finish() -> None:
            try:
                if callback is not None:
                    callback(handle)
            finally:
                q.forget(key)  # (the handle keeps the outcome for retrieve_result_callback)

        def ended(_: JobHandle[Any]) -> None:
            with self._lock:
                self._live.pop(key, None)
            callbacks.put(finish, key)

        handle.add_done_callback(ended)
        return handle

    # joblib before 1.5 calls apply_async; 1.5 and later call submit.
    apply_async = submit

    def retrieve_result_callback(self, out: JobHandle[Any]) -> Any:
        """The batch's results; a task's own exception is raised as itself, any
        ``BaseException`` (``KeyboardInterrupt``, ``SystemExit``) included, as
        with loky; any other failure (crash, timeout, memory) as ``JobFailed``."""
        if isinstance(out, _Unsent):
            raise out.error
        try:
            return out.result()
        except JobFailed as failed:
            cause = failed.failure.exception
            try:
                if failed.failure.kind == "error" and cause is not None:
                    raise cause from cause.__cause__
                if failed.failure.kind == "error":  # (its traceback's text as the cause)
                    raise UnpicklableTaskError(failed.key, failed.failure) from failed.__cause__
                raise
            finally:
                del cause  # (see _api.handle._unwrap: no cycle through this frame)

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """joblib stops the call after an error: cancel every batch still waiting
        or running (a running one's worker is killed and replaced). The queue
        stays open either way; ``terminate`` closes it."""
        q = self._queue
        with self._lock:
            keys = list(self._live)
        if q is not None:
            for key in keys:
                q.cancel(key)

    def terminate(self) -> None:
        """The end of a ``Parallel`` call: hand the queue back for the next
        call (batches joblib abandoned were cancelled by ``abort_everything``)."""
        self._release()
        self._settings = None
        self.reset_batch_stats()

    def _release(self) -> None:
        with self._lock:
            q, callbacks = self._queue, self._callbacks
            self._queue, self._callbacks = None, None
            self._live.clear()
        if callbacks is not None:
            callbacks.stop()
        if q is not None:
            _SHARED.release(q)

    def get_nested_backend(self) -> tuple[Any, int | None]:
        """What a ``Parallel`` inside a batch uses: threads one level down,
        then sequential, never more processes below procq's workers."""
        level = (self.nesting_level or 0) + 1
        if level > 1:
            return SequentialBackend(nesting_level=level), None
        return ThreadingBackend(nesting_level=level), None


class _Batch:
    """A batch, the argument of its job (``_run_batch``). Its class lives
    here so that a worker, unpickling it, imports this module and so knows
    the backend by name: a
    ``Parallel(backend="procq")`` inside a batch finds it there too (joblib's
    registry of backends is per process). ``limits``: the thread limits to
    apply in the worker before it runs (``_worker.thread_limits``)."""

    __slots__ = ("call", "limits")

    def __init__(self, call: Callable[[], Any], limits: tuple[tuple[str, int], ...] = ()) -> None:
        self.call = call
        self.limits = limits

    def __getstate__(self) -> tuple[Callable[[], Any], tuple[tuple[str, int], ...]]:
        return self.call, self.limits

    def __setstate__(self, state: tuple[Callable[[], Any], tuple[tuple[str, int], ...]]) -> None:
        self.call, self.limits = state

    def __call__(self) -> Any:
        if self.limits:
            apply_thread_limits(self.limits)
        return self.call()

    def __repr__(self) -> str:
        return f"<procq joblib batch {self.call!r}>"


def _run_batch(batch: _Batch) -> Any:
    """A batch's job: its function, the same for every batch (pickled once)."""
    return batch()


def _check_initializer(initializer: Any, initargs: Any) -> None:
    if initializer is not None and not callable(initializer):
        raise TypeError(f"initializer must be a callable, got {type(initializer).__name__}")
    if not isinstance(initargs, tuple):
        raise TypeError(f"initargs must be a tuple, got {type(initargs).__name__}")


def _cannot_start() -> str | None:
    """Why this process cannot start procq's workers, in words, or None if it can.

    - A daemonic process (a ``multiprocessing.Pool`` worker, a daemonic Dask
      worker) may not have children: ``multiprocessing`` refuses to start them.
    - A process whose default start method is one the stdlib does not know
      (a loky worker, where loky names it ``"loky"``): every child started from
      here, by spawn or by the forkserver, is told to set that start method as
      it starts, and dies there (``cannot find context for 'loky'``), whatever
      method procq itself asked for. So procq does not try there.
    """
    if multiprocessing.current_process().daemon:
        return "be called in a daemonic process (a multiprocessing worker)"
    method = multiprocessing.get_start_method(allow_none=True)
    if method is not None and method not in multiprocessing.get_all_start_methods():
        return (
            f"start workers in a process whose multiprocessing start method is {method!r} (one the stdlib does "
            f"not know: a loky worker's), as every child started from it dies at once"
        )
    return None


def register() -> None:
    """Register ``ProcqBackend`` with joblib as ``"procq"`` (done on import),
    and have procq's forkserver import this module (and so joblib) before it
    forks workers, if it has not started yet: new workers then need not
    import joblib to read their first batch."""
    joblib.register_parallel_backend(NAME, ProcqBackend)
    preload_also(__name__)


register()
threading._register_atexit(shutdown)  # type: ignore[attr-defined]  # (as concurrent.futures.process: before threads are joined)
