"""ProcQueue: the public face, blocking and asyncio, over one Core and one Supervisor.

The blocking and asyncio methods share every step but the wait for room in a
full lane: claiming, serializing, offering and sending are the same calls into
``Core``. Only how a blocked push sleeps differs (a ``threading.Event`` or an
``asyncio`` future), and how a handle is waited for (see ``_handle``).
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import multiprocessing
import sys
import threading
import time
import types
import warnings
import weakref
from typing import Any, Callable, Iterable, Iterator, Mapping, TypeVar

from procq._core import (
    BLOCKED,
    CANCELLED,
    FULL,
    STOPPED,
    Claim,
    Core,
    Ended,
    Entry,
    LaneState,
    Offer,
    WorkerSlot,
)
from procq._errors import (
    JobPicklingError,
    KeyConflict,
    KeyConflictWarning,
    LaneFull,
    QueueClosed,
)
from procq._fingerprint import fn_name, job_fingerprint
from procq._handle import JobHandle
from procq._protocol import digest, dumps, dumps_fn, pickled_by_reference
from procq._supervisor import Supervisor
from procq._values import (
    REUSE_POLICIES,
    Cached,
    Completed,
    Failed,
    InFlight,
    Job,
    Lane,
    Pending,
    Processing,
    PushOutcome,
    Queued,
    QueueStats,
    Retention,
    Reuse,
    State,
    check_wait,
)

__all__ = ["ProcQueue"]

T = TypeVar("T")

_STATES = (Pending, Processing, Completed, Failed)
MISMATCH_POLICIES = ("raise", "warn", "ignore")

_names = itertools.count(1)


class _Life(enum.Enum):
    """The queue's own lifecycle."""

    OPEN = "open"  # takes pushes
    CLOSING = "closing"  # close() began: no new pushes; waiting and running jobs finish
    CLOSED = "closed"  # every worker stopped and reaped; the supervisor thread ended


def _default_start_method() -> str:
    # forkserver forks workers from a clean single-threaded server, so the
    # supervisor's own threads are never duplicated into a child; it exists on
    # Linux. Elsewhere spawn is the safe choice.
    return "forkserver" if sys.platform.startswith("linux") else "spawn"


def _parse_lanes(lanes: int | Mapping[str, int | Lane] | None) -> dict[str, Lane]:
    if lanes is None:
        return {"default": Lane(workers=multiprocessing.cpu_count())}
    if isinstance(lanes, bool):
        raise TypeError("lanes must be an int or a mapping of lane names to int or Lane, got bool")
    if isinstance(lanes, int):
        if lanes < 1:
            raise ValueError(f"lanes={lanes}: a queue needs at least 1 worker")
        return {"default": Lane(workers=lanes)}
    if isinstance(lanes, Lane):
        return {"default": lanes}
    if not isinstance(lanes, Mapping):
        raise TypeError(
            f"lanes must be an int or a mapping of lane names to int or Lane, got {type(lanes).__name__}"
        )
    if not lanes:
        raise ValueError("lanes must name at least one lane")
    parsed: dict[str, Lane] = {}
    for name, spec in lanes.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"lane names must be non-empty str, got {name!r}")
        if isinstance(spec, Lane):
            parsed[name] = spec
        elif isinstance(spec, int) and not isinstance(spec, bool):
            if spec < 1:
                raise ValueError(f"lane {name!r} needs at least 1 worker, got {spec}")
            parsed[name] = Lane(workers=spec)
        else:
            raise TypeError(f"lane {name!r}: expected an int or a Lane, got {type(spec).__name__}")
    return parsed


class ProcQueue:
    """Runs keyed jobs in supervised worker processes.

    ``lanes`` is an int (one lane, named ``"default"``, with that many
    workers) or a mapping of lane name to an int or a :class:`Lane`. A job with
    no ``lane`` runs in the first lane. ``start_method`` is the
    ``multiprocessing`` start method for workers: ``"forkserver"`` on Linux
    and ``"spawn"`` elsewhere by default.

    ``retention`` (a :class:`Retention`) limits how long ended keys are kept;
    by default every key is kept for the life of the queue. ``reuse`` is the
    default of ``Job.reuse``: how an ended key answers a push (``"failed"``:
    a failed key runs again, a completed one answers ``Cached``).
    ``on_mismatch`` says what a push does when its key's holder (live, or
    kept after it ended) has another function or other arguments:
    ``"raise"`` ``KeyConflict`` (the default: a key names one piece of work,
    so other work under the same key is almost always a bug), ``"warn"`` (a
    ``KeyConflictWarning``, then as ``"ignore"``) or ``"ignore"`` (the key
    alone decides; no fingerprint is taken).

    Use it as a context manager, or call :meth:`close`: leaving the ``with``
    block waits for every waiting and running job, then stops and reaps every
    worker. (On ``KeyboardInterrupt`` it does not wait: waiting jobs are
    cancelled and running ones killed.)
    """

    def __init__(
        self,
        lanes: int | Mapping[str, int | Lane] | None = None,
        *,
        start_method: str | None = None,
        retention: Retention | None = None,
        reuse: Reuse = "failed",
        on_mismatch: str = "raise",
    ) -> None:
        parsed = _parse_lanes(lanes)
        if retention is not None and not isinstance(retention, Retention):
            raise TypeError(f"retention must be a procq.Retention or None, got {type(retention).__name__}")
        if reuse not in REUSE_POLICIES:
            raise ValueError(f"reuse must be 'failed', 'always' or 'never', got {reuse!r}")
        if on_mismatch not in MISMATCH_POLICIES:
            raise ValueError(f"on_mismatch must be 'raise', 'warn' or 'ignore', got {on_mismatch!r}")
        method = start_method or _default_start_method()
        if method == "fork":
            # The supervisor runs a thread, and a fork copies a threaded process
            # with its locks held mid-use; the child would also inherit every
            # other worker's pipe, so no worker would see EOF when it should.
            raise ValueError(
                "start method 'fork' is not supported: the supervisor runs a thread, and forking "
                "a threaded process can deadlock the child; use 'forkserver' or 'spawn'"
            )
        try:
            context = multiprocessing.get_context(method)
        except ValueError:
            known = ", ".join(multiprocessing.get_all_start_methods())
            raise ValueError(f"unknown start method {method!r}; this platform has {known}") from None
        if method == "forkserver":
            _preload_worker(context)
        self.start_method = method
        self._core = Core(
            parsed,
            retention,
            reuse,
            check_payload=on_mismatch != "ignore",
            strict_payload=on_mismatch == "raise",
        )
        self._life = _Life.OPEN
        self._close_lock = threading.Lock()
        # Pickles of module-level functions, made once per queue (see _serialize).
        self._fns: weakref.WeakKeyDictionary[Callable[..., Any], tuple[bytes, bytes]] = weakref.WeakKeyDictionary()
        self._supervisor = Supervisor(self._core, context, str(next(_names)))
        self._supervisor.start()
        # An unclosed queue is closed without waiting when it is garbage
        # collected or at interpreter exit, so no worker outlives it.
        self._finalizer = weakref.finalize(self, _close_now, self._core, self._supervisor)

    # --- pushing ------------------------------------------------------------

    def push(self, job: Job[T], *, timeout: float | None = None, wake: bool = False) -> PushOutcome:
        """Push ``job``: ``Queued(handle)``, ``InFlight(handle)`` or ``Cached(output)``.

        Blocks while the job's lane is full; past ``timeout`` seconds raises
        ``LaneFull`` and leaves the key exactly as it was. Raises
        ``QueueClosed`` after ``close()``, ``ValueError`` for an unknown lane,
        ``TypeError`` when the function or arguments cannot be pickled and
        ``KeyConflict`` when the key's holder has another payload.

        With ``wake=True``, a live holder of the key that waits for its
        ``not_before`` time is moved earlier: to this job's own
        ``not_before``, or now. Never later, and never a holder waiting out a
        retry backoff (a key pushed on every upstream event must not hot-loop
        while it is failing); repeated wakes change nothing more. A holder
        that is now due starts at once, without waiting for a timer.
        """
        timeout = check_wait(timeout)
        outcome, entry = self._claim(job, wake)
        if entry is not None:
            self._offer(entry, timeout)
        return outcome

    async def apush(self, job: Job[T], *, timeout: float | None = None, wake: bool = False) -> PushOutcome:
        """The asyncio form of :meth:`push`.

        While the lane is full the task waits without blocking its loop. A task
        cancelled while it waits for room releases its claim: the key goes back
        to what it was and any push that joined it is woken with ``cancelled``.
        """
        timeout = check_wait(timeout)
        outcome, entry = self._claim(job, wake)
        if entry is not None:
            await self._aoffer(entry, timeout)
        return outcome

    def _offer(self, entry: Entry, timeout: float | None) -> None:
        """Hand a fresh claim to its lane, waiting for room up to ``timeout``."""
        core = self._core
        offered = core.offer(entry)
        if offered is FULL and _may_wait(timeout):
            event = threading.Event()
            offered = core.offer(entry, event.set)
            if offered is BLOCKED:
                try:
                    event.wait(timeout)
                except BaseException:
                    core.unblock(entry, "the push was interrupted while it waited for room")
                    raise
                self._after_block(entry, timeout)
                return
        self._hand_over(entry, offered, timeout)

    async def _aoffer(self, entry: Entry, timeout: float | None) -> None:
        core = self._core
        offered = core.offer(entry)
        if offered is FULL and _may_wait(timeout):
            loop = asyncio.get_running_loop()
            room: asyncio.Future[None] = loop.create_future()

            def wakeup() -> None:
                loop.call_soon_threadsafe(_resolve, room)

            offered = core.offer(entry, wakeup)
            if offered is BLOCKED:
                try:
                    await asyncio.wait((room,), timeout=timeout)
                except BaseException:
                    core.unblock(entry, "the pushing task was cancelled while it waited for room")
                    raise
                self._after_block(entry, timeout)
                return
        self._hand_over(entry, offered, timeout)

    def push_all(self, jobs: Iterable[Job[Any]], *, wake: bool = False) -> list[PushOutcome]:
        """Push many jobs: one outcome per job, in the order given.

        Every key is checked and claimed in one critical section; a key that
        appears twice resolves the later job to the earlier one's claim. If
        any job cannot be pickled (or, with ``on_mismatch="raise"``, conflicts
        with its key's holder), nothing is pushed: every claim is released and
        the error names the job. Then the fresh jobs enter their lanes in
        order, each waiting for room like :meth:`push`.
        """
        outcomes, fresh, woken = self._claim_all(jobs, wake)
        for i, entry in enumerate(fresh):
            try:
                self._offer(entry, None)
            except BaseException:
                self._core.abandon_all(fresh[i + 1 :], "an earlier job of its batch could not be pushed")
                raise
        self._wake_all(woken)
        return outcomes

    async def apush_all(self, jobs: Iterable[Job[Any]], *, wake: bool = False) -> list[PushOutcome]:
        """The asyncio form of :meth:`push_all`."""
        outcomes, fresh, woken = self._claim_all(jobs, wake)
        for i, entry in enumerate(fresh):
            try:
                await self._aoffer(entry, None)
            except BaseException:
                self._core.abandon_all(fresh[i + 1 :], "an earlier job of its batch could not be pushed")
                raise
        self._wake_all(woken)
        return outcomes

    def push_and_wait(self, job: Job[T], timeout: float | None = None) -> T:
        """Push ``job`` and return its output (``Cached``, or once it ends).

        ``timeout`` bounds the whole call: the wait for room (``LaneFull``) and
        then the wait for the job (``TimeoutError``; the job keeps running).
        Raises ``JobFailed`` if the job fails.
        """
        timeout = check_wait(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        outcome = self.push(job, timeout=timeout)
        if isinstance(outcome, Cached):
            return outcome.output  # type: ignore[no-any-return]
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return outcome.handle.result(remaining)  # type: ignore[no-any-return]
        except TimeoutError:
            raise _unfinished(job, timeout) from None

    async def apush_and_wait(self, job: Job[T], timeout: float | None = None) -> T:
        """The asyncio form of :meth:`push_and_wait`."""
        timeout = check_wait(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        outcome = await self.apush(job, timeout=timeout)
        if isinstance(outcome, Cached):
            return outcome.output  # type: ignore[no-any-return]
        if deadline is None:
            return await outcome.handle  # type: ignore[no-any-return]
        remaining = max(0.0, deadline - time.monotonic())
        try:
            return await asyncio.wait_for(_await(outcome.handle), remaining)
        except asyncio.TimeoutError:
            raise _unfinished(job, timeout) from None

    def _claim(self, job: Job[T], wake: bool = False) -> tuple[PushOutcome, Entry | None]:
        """Claim ``job.key``. For a fresh claim, serialize the job (releasing
        the claim if that fails) and return the entry to offer to its lane."""
        core = self._core
        claim = core.claim(*self._item(job, None))
        kind, value, conflict = claim
        if conflict is not None:
            self._mismatch(job, conflict)
        if kind == "queued":
            entry: Entry = value
            try:
                self._serialize(entry)
            except BaseException:
                core.abandon(entry, "its function or arguments could not be pickled")
                raise
            return Queued(JobHandle(core, entry, self)), entry
        if wake and kind == "inflight":
            self._wake_all([(value, job)])
        return self._answer(job, claim), None

    def _item(self, job: Job[Any], index: int | None) -> tuple[Job[Any], LaneState, bytes | None, float | None]:
        if not isinstance(job, Job):
            where = "push()" if index is None else f"push_all(): job #{index}"
            raise TypeError(f"{where} takes a procq.Job, got {type(job).__name__}")
        core = self._core
        lane = core.lane_for(job)
        fp = job_fingerprint(job) if core.check_payload else None
        return job, lane, fp, None if job.not_before is None else job.due(time.monotonic())

    def _answer(self, job: Job[Any], claim: Claim) -> PushOutcome:
        """The outcome of a claim that started nothing."""
        kind, value, _ = claim
        core = self._core
        if kind == "cached":
            return Cached(value)
        if kind == "inflight":
            return InFlight(JobHandle(core, value, self))
        assert kind == "failed"  # reuse="never": the key answers with its failure
        return InFlight(JobHandle(core, Ended(job.key, Failed(value)), self))

    def _mismatch(self, job: Job[Any], conflict: tuple[str, Any]) -> None:
        differs, held_fn = conflict
        if differs == "function":
            held = "a job that ended (its function is not kept)" if held_fn is None else fn_name(held_fn)
            detail = f"another function: this push runs {fn_name(job.fn)}, the key's job {held}"
        else:
            detail = f"other arguments to the same function, {fn_name(job.fn)}"
        message = (
            f"key {job.key!r} is held by a job with {detail}. A key names one "
            "piece of work: use another key for other work, forget() an ended key to run it anew, "
            "or choose ProcQueue(on_mismatch='warn' or 'ignore')"
        )
        if self._core.strict_payload:
            raise KeyConflict(message, job.key, differs)
        warnings.warn(KeyConflictWarning(message), stacklevel=4)

    def _claim_all(
        self, jobs: Iterable[Job[Any]], wake: bool
    ) -> tuple[list[PushOutcome], list[Entry], list[tuple[Entry, Job[Any]]]]:
        """Claim a batch: its outcomes, its fresh (serialized) entries in
        order, and the live holders to wake."""
        jobs = list(jobs)
        if not jobs:
            return [], [], []
        core = self._core
        items = [self._item(job, i) for i, job in enumerate(jobs)]
        claims, conflict_at = core.claim_all(items)
        if conflict_at is not None and core.strict_payload:
            self._mismatch(jobs[conflict_at], claims[conflict_at][2])  # type: ignore[arg-type]
        for job, claim in zip(jobs, claims):
            if claim[2] is not None:
                self._mismatch(job, claim[2])
        fresh = [value for kind, value, _ in claims if kind == "queued"]
        for i, (job, (kind, value, _)) in enumerate(zip(jobs, claims)):
            if kind != "queued":
                continue
            try:
                self._serialize(value)
            except BaseException as exc:
                core.abandon_all(fresh, f"job #{i} of its batch could not be pickled")
                if isinstance(exc, JobPicklingError):
                    raise JobPicklingError(f"push_all(): nothing was pushed: job #{i} {exc}") from exc
                raise
        outcomes: list[PushOutcome] = []
        woken: list[tuple[Entry, Job[Any]]] = []
        for job, claim in zip(jobs, claims):
            if claim[0] == "queued":
                outcomes.append(Queued(JobHandle(core, claim[1], self)))
            else:
                outcomes.append(self._answer(job, claim))
                if wake and claim[0] == "inflight":
                    woken.append((claim[1], job))
        return outcomes, fresh, woken

    def _wake_all(self, woken: list[tuple[Entry, Job[Any]]]) -> None:
        core = self._core
        for entry, job in woken:
            now = time.monotonic()
            target = job.due(now)
            worker = core.wake(entry, now if target is None else target)
            if worker is not None:
                worker.channel.send_job(core, worker, entry)

    def _serialize(self, entry: Entry) -> None:
        job = entry.job
        fn = job.fn
        try:
            # A module-level function pickles to the same reference every time:
            # pickle it once per queue. Anything pickled by value (a lambda, a
            # closure) is pickled at every push, so the job runs with the values
            # it has now; its digest still spares the pipe and the worker.
            cached = self._fns.get(fn) if type(fn) is types.FunctionType else None
            if cached is None:
                data = dumps_fn(fn)
                cached = (digest(data), data)
                if type(fn) is types.FunctionType and pickled_by_reference(fn):
                    self._fns[fn] = cached
            entry.fn_id, entry.fn_bytes = cached
        except Exception as exc:
            raise JobPicklingError(f"job {job.key!r}: its function {fn!r} could not be pickled: {exc}") from exc
        try:
            entry.args_bytes = dumps((job.args, job.kwargs))
        except Exception as exc:
            raise JobPicklingError(f"job {job.key!r}: its arguments could not be pickled: {exc}") from exc

    def _hand_over(self, entry: Entry, offered: Offer, timeout: float | None) -> None:
        """Act on an offer that did not block: send the job to the worker that
        took it, leave it in its lane, or refuse it and release the claim."""
        core = self._core
        if isinstance(offered, WorkerSlot):
            offered.channel.send_job(core, offered, entry)
        elif offered is CANCELLED:
            pass  # q.cancel() came first: the handle says so
        elif offered is FULL:
            core.abandon(entry, f"lane {entry.lane.name!r} was full")
            raise _lane_full(entry, timeout)
        elif offered is STOPPED:
            core.abandon(entry, "the queue stopped")
            raise QueueClosed(f"the queue stopped before job {entry.key!r} could run")

    def _after_block(self, entry: Entry, timeout: float | None) -> None:
        """A push stopped waiting for room: it was accepted, or it gives up."""
        why = f"no room in lane {entry.lane.name!r} within {timeout}s"
        if self._core.unblock(entry, why) == "accepted":
            return
        if self._core.closing:
            raise QueueClosed(f"the queue was closed while job {entry.key!r} waited for room")
        raise _lane_full(entry, timeout)

    # --- cancelling -----------------------------------------------------------

    def cancel(self, key: str) -> bool:
        """Cancel the live job of ``key``; True if this call cancelled it.

        A waiting job is taken out of its lane without running; a running
        job's worker process tree is killed (SIGTERM, then SIGKILL after the
        lane's ``kill_grace``) and the worker replaced. Either way the job ends
        ``Failed(kind="cancelled")``, every waiter is woken, and the key can be
        pushed again like any failed key. Returns False, changing nothing, for
        an unknown key, a finished one, or a job already being ended for
        another reason (a timeout, say). A job that finishes just as it is
        cancelled ends once: cancelled if this returned True.

        It never waits for a job, so it is safe to call from an event loop
        as it is. A job already sent ahead to a busy worker is skipped by that
        worker (it is told before this returns), unless it had started.
        """
        _check_key(key)
        return self._supervisor.cancel(key)

    # --- keys ---------------------------------------------------------------

    def map(
        self,
        fn: Callable[[Any], T],
        iterable: Iterable[Any],
        *,
        key: Callable[[Any], str] | None = None,
        lane: str | None = None,
        ordered: bool = True,
        return_failures: bool = False,
        chunksize: int = 1,
        keep: bool = False,
    ) -> Iterator[Any]:
        """``fn(item)`` for every item, run as jobs: a lazy iterator over the outputs.

        Items are pulled from ``iterable`` only as the lane has room (at most
        256 items, and at least two jobs per worker, are out at once), so an
        endless or huge input runs in bounded memory. Each job's key is ``key(item)``,
        or a content hash of ``fn`` and the item (``"map:<fn digest>:<item
        digest>"``): an item whose key is live or kept answers from the queue
        like any push. ``chunksize`` items go to a job together (its key is
        made from theirs), for many small items. By default a key this map
        claimed is forgotten once its output has been handed out, so a long
        map leaves nothing behind; ``keep=True`` keeps them (subject to the
        queue's retention). With ``ordered=True`` outputs come in input order,
        else as jobs end. A failed job raises ``JobFailed`` where its output
        would come (ending the iteration), or with ``return_failures=True`` is
        yielded as the ``JobFailed`` exception itself (once per item of a
        failed chunk).
        """
        from procq._map import map_jobs

        return map_jobs(self, fn, iterable, key, lane, ordered, return_failures, chunksize, keep)

    def forget(self, key: str) -> bool:
        """Drop an ended key (completed or failed), as if it was never pushed.

        Returns False for a key the queue does not hold. A live key (pending
        or running) cannot be forgotten: ``ValueError``.
        """
        _check_key(key)
        return self._core.forget(key)

    def keys(self, prefix: str | None = None, state: Any = None) -> list[str]:
        """Every key the queue holds, sorted; only those starting with
        ``prefix`` and, given ``state`` (a state class such as ``Completed``,
        or a tuple of them), only those in that state."""
        return [e.key for e in self._core.snapshot(*_filters(prefix, state))]

    def handles(self, prefix: str | None = None, state: Any = None) -> list[JobHandle[Any]]:
        """A handle on every key the queue holds (filtered as :meth:`keys`),
        sorted by key: ``handle.key`` and ``handle.state`` answer "where is
        each key now?", and a live key's handle waits like any other. A
        snapshot: keys pushed later are not in it."""
        core = self._core
        return [JobHandle(core, e, self) for e in core.snapshot(*_filters(prefix, state))]

    # --- reading ------------------------------------------------------------

    def state(self, key: str) -> State | None:
        """The key's state: ``Pending()``, ``Processing()``, ``Completed(output)``,
        ``Failed(failure)``, or ``None`` for a key this queue does not hold
        (never pushed, forgotten, or dropped by its retention)."""
        _check_key(key)
        return self._core.state(key)

    def stats(self) -> QueueStats:
        """Counts of keys per state, and per lane: waiting, running, workers
        alive, crashes and worker restarts."""
        return self._core.stats()

    @property
    def lanes(self) -> dict[str, Lane]:
        return {name: lane.spec for name, lane in self._core.lanes.items()}

    # --- closing ------------------------------------------------------------

    def close(self, wait: bool = True) -> None:
        """Stop taking pushes (``QueueClosed``), end the jobs, stop and reap every worker.

        With ``wait=True`` every waiting and running job finishes first. With
        ``wait=False`` waiting jobs are cancelled, running jobs' process trees
        are killed, and all of them end ``Failed(kind="cancelled")``. Either
        way, when ``close`` returns no worker process is left alive or
        unreaped. Calling it again does nothing; a ``KeyboardInterrupt`` while
        it waits turns it into ``close(wait=False)``.
        """
        with self._close_lock:
            if self._life is _Life.CLOSED:
                return
            self._life = _Life.CLOSING
            core, supervisor = self._core, self._supervisor
            core.start_closing()
            if not wait:
                supervisor.cancel_all()
            try:
                core.drained.wait()
            except BaseException:
                supervisor.cancel_all()
                core.drained.wait()
                raise
            finally:
                supervisor.stop()
                self._finalizer.detach()
                self._life = _Life.CLOSED

    @property
    def closed(self) -> bool:
        return self._life is not _Life.OPEN

    def __enter__(self) -> ProcQueue:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: Any) -> None:
        self.close(wait=not (exc_type is not None and issubclass(exc_type, KeyboardInterrupt)))

    def __repr__(self) -> str:
        lanes = ", ".join(f"{n}={lane.spec.workers}" for n, lane in self._core.lanes.items())
        return f"<ProcQueue {self._life.value} lanes({lanes})>"

    # --- for tests ------------------------------------------------------------

    def _check_invariants(self) -> None:
        self._core._check_invariants()

    def _worker_pids(self) -> list[int]:
        return self._supervisor.pids()


def _check_key(key: Any) -> None:
    if not isinstance(key, str):
        raise TypeError(f"a key is a str, got {type(key).__name__}: {key!r}")


def _filters(prefix: Any, state: Any) -> tuple[str | None, tuple[type, ...] | None]:
    if prefix is not None and not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str or None, got {type(prefix).__name__}")
    if state is None:
        return prefix, None
    kinds = tuple(state) if isinstance(state, (tuple, list, set, frozenset)) else (state,)
    for kind in kinds:
        if kind not in _STATES:
            raise TypeError(
                f"state must be Pending, Processing, Completed or Failed (or a tuple of them), got {kind!r}"
            )
    return prefix, kinds


def _preload_worker(context: Any) -> None:
    """Have the forkserver import procq before it forks, so that every worker
    starts with it loaded. Only until the forkserver has started, which is
    once per process; the modules already asked for are kept.

    Why all of procq, not just the worker's module: each forkserver child
    imports the main module again (Python 3.11's forkserver never preloads
    ``__main__``, whatever the preload list says), and a program that uses
    procq imports it from there; preloaded, that costs the child nothing.
    """
    try:
        from multiprocessing import forkserver

        server: Any = forkserver._forkserver  # private: no public way to read the list
        if server._forkserver_pid is not None:
            return
        modules = list(server._preload_modules)
    except Exception:  # pragma: no cover - the stdlib's internals changed
        return
    wanted = [m for m in ("procq._worker", "procq._queue") if m not in modules]
    if wanted:
        context.set_forkserver_preload([*modules, *wanted])


def _unfinished(job: Job[Any], timeout: float | None) -> TimeoutError:
    return TimeoutError(f"job {job.key!r} has not finished after {timeout}s; it keeps running")


def _may_wait(timeout: float | None) -> bool:
    return timeout is None or timeout > 0


def _lane_full(entry: Entry, timeout: float | None) -> LaneFull:
    lane: LaneState = entry.lane
    return LaneFull(
        f"lane {lane.name!r} is full (capacity {lane.spec.capacity}) and had no room for "
        f"job {entry.key!r} within {timeout or 0}s; the key is left as it was"
    )


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _await(handle: JobHandle[T]) -> T:
    return await handle


def _close_now(core: Core, supervisor: Supervisor) -> None:
    """Close a queue nobody closed (collected, or at exit), without waiting."""
    core.start_closing()
    supervisor.cancel_all()
    core.drained.wait()
    supervisor.stop()
