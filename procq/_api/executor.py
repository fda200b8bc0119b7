"""``procq.Executor``: a drop-in ``concurrent.futures.Executor`` over one ``ProcQueue``.

It takes what ``ProcessPoolExecutor`` takes and behaves as its tests ask
(``tests/test_executor_cpython.py`` runs CPython's own process-pool tests on
it, their assertions unchanged), with procq underneath: a job whose worker
crashes fails its own future and nothing else; the executor is never broken.

Keys. Every procq job has a key. ``submit`` gives each call a fresh one,
``"executor:<token>:<n>"`` (a per-executor random token and a counter), so
procq never merges two submissions by accident, and forgets it once its
future is resolved (with a store, the next ``submit`` or ``shutdown`` deletes
its row, from the caller's thread), so a long-lived executor keeps nothing per
finished job, nor a reference to its output.
``submit(fn, *args, procq_key="k", **kwargs)`` opts into procq's keyed
dedup instead: a key that is live joins that job, one that completed answers
with its output, and it is kept as any pushed key is. The keyword is
``procq_key`` rather than ``key`` because ``submit`` passes every other
keyword to ``fn``, and ``key=`` is a common argument of the functions people
submit (``sorted``, ``max``); ``procq_lane`` likewise picks a lane.

Futures are ``procq._api.futures.JobFuture`` objects (real ``Future`` objects),
resolved from their handles' done callbacks. Calls reach the queue as they
reach ``ProcessPoolExecutor``'s call queue, a lane's workers + 1 ahead of
them (``procq._api.executor_feed``): a future is PENDING, and ``cancel()`` and
``shutdown(cancel_futures=True)`` cancel it, until its call is handed over;
then it is RUNNING and runs to its end.

Errors, as ``ProcessPoolExecutor``'s futures raise them, so code written for
it keeps working: a job's own exception, any ``BaseException``
(``SystemExit``, ``KeyboardInterrupt``) included; what pickling its result
raised; for a function or arguments that cannot be pickled, the future fails
with ``JobPicklingError`` (a ``PicklingError``) and ``submit`` returns it;
where ``ProcessPoolExecutor`` would raise ``BrokenProcessPool`` (the worker
died, or the job's task or outcome could not cross between the processes),
``BrokenJob``, which is both a ``BrokenProcessPool`` and a ``JobFailed``
(``failure.kind == "crashed"``, ``failure.signal``...). It fails only that
job: the next ``submit`` works, and a program that rebuilds its pool on
``BrokenProcessPool`` rebuilds it needlessly but loses nothing.
``InitializerFailed`` is a ``BrokenProcessPool`` too. procq's own limits
(``timeout``, ``memory_limit``) fail with ``JobFailed``.

An executor dropped without ``shutdown()`` is freed as soon as it is
unreachable (nothing it owns refers back to it): as ``ProcessPoolExecutor``,
its submitted calls run to their end, then its workers stop.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import os
import secrets
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from procq._api.config import parse_lanes
from procq._api.executor_calls import Initialized, LoggedInitializer, run_chunk
from procq._api.executor_feed import Call, Feed
from procq._api.futures import JobFuture
from procq._api.outcomes import Cached, Queued
from procq._api.queue import ProcQueue
from procq._model.errors import JobPicklingError, QueueClosed
from procq._model.job import Job, Lane
from procq._model.policies import Retry

__all__ = ["Executor"]

T = TypeVar("T")

#: The default lane's capacity: ``submit`` never waits for room, as the stdlib's does not.
UNBOUNDED = 2**62

_executors: weakref.WeakSet[Executor] = weakref.WeakSet()
_interpreter_exiting = False


class Executor(concurrent.futures.Executor):
    """Run calls in procq worker processes; a drop-in for ``ProcessPoolExecutor``.

    ``max_workers`` (default: the CPU count), ``mp_context`` (a
    ``multiprocessing`` context or a start method name: ``"forkserver"`` or
    ``"spawn"``; procq does not run workers with ``"fork"``), ``initializer``
    and ``initargs`` (run in each worker before its first job of this
    executor; see ``procq._api.executor_calls`` for what a failing one does) and
    ``max_tasks_per_child`` (a worker is replaced after that many jobs) mean
    what they mean for ``ProcessPoolExecutor``.

    procq's own options: ``lanes`` (as for ``ProcQueue``, instead of
    ``max_workers``/``max_tasks_per_child``; ``submit(..., procq_lane=name)``
    picks one, and a full lane makes ``submit`` wait for room), and for every
    job ``timeout`` (seconds once started), ``memory_limit`` (bytes or
    ``"512M"``), ``retry`` (a ``Retry``) and ``store`` (keys in a database,
    as ``ProcQueue(store=...)``). ``queue`` is the ``ProcQueue`` underneath.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        mp_context: Any = None,
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
        *,
        max_tasks_per_child: int | None = None,
        lanes: int | Mapping[str, int | Lane] | None = None,
        timeout: float | None = None,
        memory_limit: int | str | None = None,
        retry: Retry | None = None,
        store: Any = None,
    ) -> None:
        if lanes is not None and (max_workers is not None or max_tasks_per_child is not None):
            raise ValueError(
                "Executor: give either lanes or max_workers/max_tasks_per_child, not both "
                "(a Lane has workers= and max_jobs_per_worker=)"
            )
        if lanes is None:
            if max_workers is None:
                max_workers = os.cpu_count() or 1
            elif isinstance(max_workers, bool) or not isinstance(max_workers, int):
                raise TypeError(f"max_workers must be an int or None, got {type(max_workers).__name__}")
            elif max_workers <= 0:
                raise ValueError("max_workers must be greater than 0")
            if max_tasks_per_child is not None and (
                isinstance(max_tasks_per_child, bool) or not isinstance(max_tasks_per_child, int)
            ):
                raise TypeError("max_tasks_per_child must be an integer")
            if max_tasks_per_child is not None and max_tasks_per_child <= 0:
                raise ValueError("max_tasks_per_child must be >= 1")
            lanes = {"default": Lane(workers=max_workers, capacity=UNBOUNDED, max_jobs_per_worker=max_tasks_per_child)}
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if not isinstance(initargs, tuple):
            raise TypeError(f"initargs must be a tuple, got {type(initargs).__name__}")
        self._token = secrets.token_hex(6)
        self._initializer = initializer
        self._initargs = initargs
        # Lanes whose jobs carry the initializer (``Initialized``): those that are not local trusted processes.
        self._init_per_job: set[str] = set()
        if initializer is not None:
            lanes = self._with_initializer(parse_lanes(lanes), initializer, initargs)
        # Checked by a Job now, not at the first submit:
        Job("check", int, timeout=timeout, memory_limit=memory_limit, retry=retry)
        self._timeout, self._memory_limit, self._retry = timeout, memory_limit, retry
        self.queue = ProcQueue(lanes, start_method=_start_method(mp_context), store=store)
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self._shutdown = False
        # Per lane, how many of its jobs may be handed to the queue at once: its workers + 1.
        self._windows = {name: spec.workers + 1 for name, spec in self.queue.lanes.items()}
        self._default_lane = next(iter(self._windows))
        self._forgettable: deque[str] = deque()  # generated keys of resolved futures, to drop
        self._hand_over = _HandOver(self.queue, self._forgettable)
        self._feed = Feed(self._windows, self._hand_over)
        self._hand_over.feed = self._feed
        self._closer: threading.Thread | None = None
        _executors.add(self)
        # Dropped without shutdown(): as shutdown(wait=False). (At exit, _python_exit does it.)
        self._finalizer = weakref.finalize(self, _dropped, self._feed, self.queue)
        self._finalizer.atexit = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        """Run ``fn(*args, **kwargs)`` in a worker; a ``Future`` of its result.

        ``procq_key=`` and ``procq_lane=`` are taken by procq, not passed to
        ``fn`` (see the module docstring). Raises ``RuntimeError`` after
        ``shutdown()``, as the stdlib does. A function or arguments that cannot
        be pickled fail the future (``JobPicklingError``, a ``PicklingError``
        and a ``TypeError``), as ``ProcessPoolExecutor``'s would fail.
        """
        key: str | None = kwargs.pop("procq_key", None)
        lane: str | None = kwargs.pop("procq_lane", None)
        if self._shutdown:
            raise RuntimeError("cannot schedule new futures after shutdown")
        if _interpreter_exiting:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")
        self._drop_forgettable()
        mine = key is None
        if key is None:
            key = f"executor:{self._token}:{next(self._counter)}"
        lane_name = self._lane_name(lane)
        call: Callable[..., Any] = fn
        if self._initializer is not None and lane_name in self._init_per_job:
            call = Initialized(fn, self._initializer, self._initargs, self._token)
        job = Job(
            key, call, args, kwargs or None, lane=lane, timeout=self._timeout, memory_limit=self._memory_limit,
            retry=self._retry,
        )  # fmt: skip
        future: JobFuture[T] = JobFuture(None, owned=False, unwrap=True)
        item = Call(job, lane_name, future, mine)
        if self._feed.submit(item):
            self._hand_over(item, raising=True)
        return future

    def _with_initializer(
        self, lanes: dict[str, Lane], initializer: Callable[..., object], initargs: tuple[Any, ...]
    ) -> dict[str, Lane]:
        """The lanes, each local trusted one given the initializer: its workers
        run it as they start (initargs pass as ``ProcessPoolExecutor``'s do).
        The others' jobs carry it (``Initialized``)."""
        out = {}
        for name, spec in lanes.items():
            if spec.initializer is not None:
                raise ValueError(f"Executor: lane {name!r} has an initializer of its own; give one or the other")
            if spec.trusted and not spec.remote:
                spec = dataclasses.replace(spec, initializer=LoggedInitializer(initializer), initargs=initargs)
            else:
                self._init_per_job.add(name)
            out[name] = spec
        return out

    def _lane_name(self, lane: str | None) -> str:
        if lane is None:
            return self._default_lane
        if lane not in self._windows:
            known = ", ".join(repr(name) for name in self._windows)
            raise ValueError(f"submit(): unknown lane {lane!r}; this executor's lanes are {known}")
        return lane

    def map(
        self, fn: Callable[..., T], *iterables: Iterable[Any], timeout: float | None = None, chunksize: int = 1
    ) -> Iterator[T]:
        """``fn(*args)`` for the items of ``iterables`` zipped, as the stdlib's
        ``map``: every call is submitted at once, outputs come in order, and
        ``timeout`` (from this call) raises ``TimeoutError`` at the first output
        not ready by then. ``chunksize`` items go to a worker per job."""
        if isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        if chunksize == 1:
            return super().map(fn, *iterables, timeout=timeout)
        chunks = super().map(run_chunk, itertools.repeat(fn), _chunks(iterables, chunksize), timeout=timeout)
        return _flatten(chunks)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more submissions; with ``cancel_futures`` cancel the calls not
        yet handed to the queue (those handed over run to their end, as in
        ``ProcessPoolExecutor``); with ``wait`` return once every job has ended
        and every worker is reaped. ``wait=False`` returns at once: a thread
        closes the queue once the remaining jobs end (and the interpreter waits
        for it at exit)."""
        with self._lock:
            self._shutdown = True
        self._finalizer.detach()
        if cancel_futures:
            for item in self._feed.take_waiting():
                item.future.cancel()
        if wait:
            self._close()
            self._drop_forgettable()
        else:
            with self._lock:
                if self._closer is None:
                    self._closer = threading.Thread(target=self._close, name="procq-executor-shutdown")
                    self._closer.start()

    def _close(self) -> None:
        """Hand the waiting calls over, then close the queue once every job ended."""
        self._feed.drain()
        self.queue.close()

    def _drop_forgettable(self) -> None:
        while True:
            try:
                key = self._forgettable.popleft()
            except IndexError:
                return
            with contextlib.suppress(ValueError, QueueClosed):  # (ValueError: live again, pushed since)
                self.queue.forget(key)

    def __repr__(self) -> str:
        state = "shut down" if self._shutdown else "running"
        return f"<procq.Executor {state} {self.queue!r}>"


class _HandOver:
    """Hands a call's job to the queue: the executor's ``Feed`` calls it, and
    ``submit``. It holds what it needs and not the executor, so that an
    executor nobody shut down is freed once unreachable (see ``_dropped``)."""

    __slots__ = ("_feed", "forgettable", "queue")

    def __init__(self, queue: ProcQueue, forgettable: deque[str]) -> None:
        self.queue = queue
        self.forgettable = forgettable
        # The feed that calls this, held weakly: no cycle keeps the queue
        # alive until the cyclic collector runs (whose finalizers, run at any
        # allocation, could then land inside multiprocessing's own locks).
        self._feed: weakref.ref[Feed] | None = None

    @property
    def feed(self) -> Feed | _NoFeed:
        feed = None if self._feed is None else self._feed()
        return _NO_FEED if feed is None else feed

    @feed.setter
    def feed(self, feed: Feed) -> None:
        self._feed = weakref.ref(feed)

    def __call__(self, item: Call, raising: bool = False) -> None:
        """Push a call's job (from the submitting thread, or the feeder's): its
        future runs from now on. A push that fails fails the future; ``raising``
        (the submitting thread) lets ``QueueClosed`` through as the stdlib's
        ``RuntimeError``."""
        future, job = item.future, item.job
        if not future.handed_over():  # cancelled while it waited
            self.feed.ended(item.lane)
            return
        try:
            outcome = self.queue.push(job)
        except QueueClosed:
            self.feed.ended(item.lane)
            if raising:
                future.set_exception(RuntimeError("cannot schedule new futures after shutdown"))
                raise RuntimeError("cannot schedule new futures after shutdown") from None
            future.set_exception(RuntimeError("the executor's queue closed before the job could be handed to it"))
            return
        except JobPicklingError as exc:  # failed in the future, as ProcessPoolExecutor fails it
            self.feed.ended(item.lane)
            future.set_exception(exc)
            return
        except BaseException as exc:  # (a key conflict, an interrupt): the submitting thread's to see
            self.feed.ended(item.lane)
            future.set_exception(exc)
            if raising:
                raise
            return
        if isinstance(outcome, Cached):
            self.feed.ended(item.lane)
            future.set_result(outcome.output)
            return
        handle = outcome.handle
        future._owned = isinstance(outcome, Queued)
        forget = item.mine and future._owned
        lane = item.lane

        def ended(_: Any) -> None:
            self.feed.ended(lane)
            if forget:
                if self.queue._store is None:  # the core's forget is a dict change under its lock: safe here
                    with contextlib.suppress(ValueError):
                        self.queue._core.forget(handle.key)
                else:  # a row's delete, from the caller's thread (never from a committing thread)
                    self.forgettable.append(handle.key)

        future._handle = handle
        handle.add_done_callback(future._settle)
        handle.add_done_callback(ended)


class _NoFeed:
    """The feed once it is gone (its executor dropped, no call left waiting): room is nobody's concern."""

    def ended(self, lane: str) -> None:
        return None


_NO_FEED = _NoFeed()


def _start_method(mp_context: Any) -> str | None:
    """A ``multiprocessing`` context, a start method's name or None, as a start method's name."""
    if mp_context is None or isinstance(mp_context, str):
        return mp_context
    get = getattr(mp_context, "get_start_method", None)
    if get is None:
        raise TypeError(
            "mp_context must be a multiprocessing context, a start method name or None, "
            f"got {type(mp_context).__name__}"
        )
    method: str = get(allow_none=False)
    return method


def _chunks(iterables: tuple[Iterable[Any], ...], size: int) -> Iterator[list[tuple[Any, ...]]]:
    """The zipped argument tuples, ``size`` at a time."""
    args = zip(*iterables, strict=False)  # (the shortest ends it, as map() does)
    while chunk := list(itertools.islice(args, size)):
        yield chunk


def _flatten(chunks: Iterator[list[T]]) -> Iterator[T]:
    try:
        for chunk in chunks:
            chunk.reverse()  # (pop from the end: no reference to an output outlives its yield)
            while chunk:
                yield chunk.pop()
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def _dropped(feed: Feed, queue: ProcQueue) -> None:
    """An executor became unreachable without ``shutdown()``: as
    ``ProcessPoolExecutor``, its submitted calls run to their end, then its
    workers stop, on a thread of their own (this runs wherever the last
    reference went, maybe procq's I/O thread)."""
    with contextlib.suppress(RuntimeError):  # (no new thread at interpreter shutdown: _python_exit's then)
        threading.Thread(target=_finish, args=(feed, queue), name="procq-executor-shutdown").start()


def _finish(feed: Feed, queue: ProcQueue) -> None:
    feed.drain()
    queue.close()


def _python_exit() -> None:
    """At interpreter exit (before the non-daemon threads are joined): let every
    executor's submitted jobs finish, as ``ProcessPoolExecutor`` does, and refuse
    new ones."""
    global _interpreter_exiting
    _interpreter_exiting = True
    for executor in list(_executors):
        with contextlib.suppress(Exception):
            executor._close()


threading._register_atexit(_python_exit)  # type: ignore[attr-defined]  # (what concurrent.futures.process uses)
