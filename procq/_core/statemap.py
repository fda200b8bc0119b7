"""The state map: every key's life, and the one place its status changes.

``StateMap.live`` holds the live keys (Pending or Processing), each as its
``Entry``; ``StateMap.records`` (a ``_core.records.KeyRecords``) holds the keys that
ended. A claim moves a key from absent or ended to Pending; ``start``,
``finish`` (an attempt's end: settled, or back to Pending for a retry),
``settle`` and ``abandon`` move it on. Each of them changes the entry's status
through ``_move``, which keeps every count that follows a status in step with
it: the live map itself, the running jobs (the queue's, and each lane's), the
running jobs with a memory limit, each lane's completed / failed / retried
attempts, and what its ``Tally`` counts for the metrics (``_core.metrics``):
attempts started, failures by kind, live keys, run and wait times. A claim
counts its lane's pushes, joins and cached answers. The records store keeps
the completed and failed counts.

::

    absent / ended ──claim──> Pending ──(due)──> in its lane ──start──> Processing ──finish──> Completed | Failed
                                 │  ^                                        │
                                 │  └──── retry: Pending(attempt + 1), ──────┤ (a failed attempt,
                                 │        back to its timer (backoff)        │  with a Retry left)
                                 │ abandon                                   │ (worker dies: "crashed";
                                 v                                           │  deadline: "timeout")
                       back to what it was                                   v
                       (joiners: Failed "cancelled")                        ...

A Pending key that has not started may also be settled at once (``q.cancel``,
a lane whose workers cannot start, closing without waiting). Which ended keys
are answered from their record and which run again is the reuse policy
(``Job.reuse``).

The map also holds the queue's door: ``closing`` (no claim is taken),
``stopped`` and ``cancelled`` (nothing enters a lane or is retried),
``broken`` (why the I/O thread died, if it did) and ``drained``. Everything
here runs under ``Core.lock``; times are given, read from ``Core.clock``.
"""

from __future__ import annotations

import enum
import itertools
import random
import threading
import time
from bisect import bisect_left
from collections import deque
from dataclasses import replace
from typing import Any, NamedTuple

from procq._core.entries import (
    ABANDONED,
    DONE,
    PENDING,
    PROCESSING,
    Ended,
    Entry,
    LaneState,
    Status,
    Wakeup,
    WorkerSlot,
)
from procq._core.metrics import RECENT_FAILURES
from procq._core.records import KeyRecords
from procq._core.retention import FP, KEY, OUTPUT, Record, record_state
from procq._core.timers import Timers
from procq._model.errors import QueueClosed
from procq._model.job import Job
from procq._model.values import Completed, Failed, Failure, LaneStats, QueueStats, State
from procq._wire.fingerprint import describe

__all__ = ["Claim", "ClaimKind", "StateMap", "conflict", "new_claim"]


class ClaimKind(str, enum.Enum):
    """What a claim found (a ``str``, so it compares equal to its value)."""

    QUEUED = "queued"  # the key is claimed: value is the new Entry (offer it, or abandon it)
    INFLIGHT = "inflight"  # the key is live: value is its Entry
    CACHED = "cached"  # the key completed: value is its output
    FAILED = "failed"  # the key failed and never runs again (reuse="never"): value is its Failure


QUEUED, INFLIGHT, CACHED, FAILED = ClaimKind.QUEUED, ClaimKind.INFLIGHT, ClaimKind.CACHED, ClaimKind.FAILED


class Claim(NamedTuple):
    """What ``Core.claim`` answers for one job."""

    kind: ClaimKind
    value: Any
    #: None, or (what differs: "function" | "arguments", the holder's
    #: function, or None when only a record is left).
    conflict: tuple[str, Any] | None


#: Claims are made on every push: ``newnew_claim(Claim, (kind, value, conflict))``
#: builds one without the NamedTuple's Python-level ``__new__``.
new_claim = tuple.__new__


def conflict(held: bytes | None, pushed: bytes | None, held_fn: Any) -> tuple[str, Any] | None:
    """How a pushed job's fingerprint conflicts with its key's holder's, if it does."""
    if held is None or pushed is None or held == pushed:
        return None
    differs = describe(held, pushed)
    return None if differs is None else (differs, held_fn)


class StateMap:
    """The live keys and the records of ended ones (see the module docstring)."""

    __slots__ = (
        "_ids",
        "_random",
        "broken",
        "cancelled",
        "check_payload",
        "closing",
        "drained",
        "failures",
        "live",
        "memory_jobs",
        "processing",
        "records",
        "reuse",
        "stopped",
        "strict_payload",
        "timers",
    )

    def __init__(
        self, records: KeyRecords, timers: Timers, reuse: str, check_payload: bool, strict_payload: bool
    ) -> None:
        self.live: dict[str, Entry] = {}  # invariant: no key is both live and answered by a record
        self.records = records
        self.timers = timers
        self.reuse = reuse  # the queue's default reuse policy
        self.check_payload = check_payload  # fingerprints are kept and compared
        self.strict_payload = strict_payload  # a conflict refuses the claim (on_mismatch="raise")
        self._ids = itertools.count(1)
        self._random = random.Random()
        # Counts that follow the statuses (changed only by _move); Pending is
        # len(live) - processing.
        self.processing = 0
        self.memory_jobs = 0  # running jobs with a memory limit: the I/O thread samples them
        self.closing = False  # no claim is taken
        self.stopped = False  # the supervisor stopped: nothing enters a lane
        self.cancelled = False  # close(wait=False) began: nothing enters a lane
        # Why the supervisor's I/O thread died, if it did: the queue then takes
        # no claim (closing is set) and says why.
        self.broken: BaseException | None = None
        self.drained = threading.Event()  # set while closing and nothing is live
        # The last failures, for ``procq top``: (time.time(), key, lane, kind, message).
        self.failures: deque[tuple[float, str, str, str, str]] = deque(maxlen=RECENT_FAILURES)

    def close(self, broken: BaseException | None = None) -> None:
        """Take no more claims (``broken``: the I/O thread died of it)."""
        self.broken = broken if broken is not None else self.broken
        self.closing = True
        if not self.live:
            self.drained.set()

    # --- claiming ---------------------------------------------------------------

    def cached(self, job: Job[Any], lane: LaneState, fp: bytes | None) -> Claim | None:
        """The answer to a push of a completed key, from its record, without the
        lock; None where it takes the lock (``claim``). Only where no retention
        may change a record (``records.expires`` false) and the door is open:
        a record never changes in place then, and the store's read is atomic,
        so the read is the push's moment: threads pushing cached keys never queue."""
        rec = self.records.peek(job.key)
        if type(rec) is not tuple or (job.reuse or self.reuse) == "always":  # (a tuple: a Done)
            return None
        held = rec[FP]
        differs = None if held == fp or held is None or fp is None else conflict(held, fp, None)
        if differs is None or not self.strict_payload:  # (else the push raises: no answer to count)
            lane.count_cached()  # (atomic without the lock: see _metrics)
        return new_claim(Claim, (CACHED, rec[OUTPUT], differs))

    def claim(self, job: Job[Any], lane: LaneState, fp: bytes | None, due: float | None, now: float) -> Claim:
        """Check and claim ``job.key``: join its live entry, answer from its
        record, or make a new PENDING entry, in no lane yet."""
        if self.closing:
            if self.broken is not None:
                raise QueueClosed(
                    f"the queue is closed: its supervisor thread died ({_describe(self.broken)}); "
                    f"cannot push job {job.key!r}"
                ) from self.broken
            raise QueueClosed(f"the queue is closed; cannot push job {job.key!r}")
        key = job.key
        entry = self.live.get(key)
        if entry is not None:
            differs = conflict(entry.fp, fp, entry.job.fn)
            if differs is None or not self.strict_payload:
                lane.tally.joined += 1
            return new_claim(Claim, (INFLIGHT, entry, differs))
        records = self.records
        rec = records.lookup(key, now)
        if rec is not None:
            reuse = job.reuse or self.reuse
            if type(rec) is tuple:  # completed (a Done: see _core.retention)
                if reuse != "always":
                    differs = conflict(rec[FP], fp, None)
                    if differs is None or not self.strict_payload:
                        records.used(rec)
                        lane.tally.cached += 1
                    return new_claim(Claim, (CACHED, rec[OUTPUT], differs))
            elif reuse == "never":
                return new_claim(Claim, (FAILED, rec.failure, conflict(rec[FP], fp, None)))  # type: ignore[union-attr]
            records.take(rec)
        entry = Entry(job, lane, next(self._ids), rec)  # born PENDING
        entry.fp = fp if self.check_payload else None
        if due is not None and due > now:
            entry.due = due
        entry.since = now
        tally = lane.tally
        tally.pushed += 1
        tally.live += 1
        self.live[key] = entry
        return new_claim(Claim, (QUEUED, entry, None))

    def lookup(self, key: str, now: float) -> Entry | Record | None:
        """The key's live entry or its record (retention honoured)."""
        entry = self.live.get(key)
        return entry if entry is not None else self.records.lookup(key, now)

    # --- status changes -------------------------------------------------------------

    def _move(self, entry: Entry, to: Status, now: float, ran: bool = True) -> None:
        """The one place an entry's status changes, with the counts that follow it.
        ``ran=False``: back from PROCESSING to PENDING for an attempt that
        never started (``unstart``): its start is uncounted, not its run."""
        was = entry.status
        entry.status = to
        lane = entry.lane
        if to is PROCESSING:
            self.processing += 1
            lane.running += 1
            if entry.memory_limit is not None:
                self.memory_jobs += 1
            tally = lane.tally
            tally.started += 1
            wait = now - entry.since  # (Histogram.observe, inlined: this runs for every job)
            h = tally.wait
            h.counts[bisect_left(h.bounds, wait)] += 1
            h.sum += wait
            entry.started = now
            return
        if was is PROCESSING:
            self.processing -= 1
            lane.running -= 1
            if entry.memory_limit is not None:
                self.memory_jobs -= 1
            if not ran:  # handed to a worker that died before starting it: as if never given
                tally = lane.tally
                tally.started -= 1
                wait = entry.started - entry.since
                h = tally.wait
                h.counts[bisect_left(h.bounds, wait)] -= 1
                h.sum -= wait
                entry.started = 0.0
                return
            took = now - entry.started  # (Histogram.observe, inlined)
            h = lane.tally.run
            h.counts[bisect_left(h.bounds, took)] += 1
            h.sum += took
            if to is PENDING:  # a failed attempt, to be run again
                lane.retries += 1
                return
        if to is DONE:
            outcome = entry.outcome
            if type(outcome) is Completed:
                lane.completed += 1
            else:
                lane.failed += 1
                failure: Failure = outcome.failure  # type: ignore[union-attr]
                lane.tally.failures[failure.kind] += 1
                self.failures.append((time.time(), entry.key, lane.name, failure.kind, failure.message))
        lane.tally.live -= 1
        del self.live[entry.key]  # DONE or ABANDONED

    def start(self, entry: Entry, worker: WorkerSlot, now: float) -> None:
        """``entry`` is now the job ``worker`` runs."""
        self._move(entry, PROCESSING, now)
        entry.pid = worker.pid
        if entry.prev is not None:  # past its lane's door: the claim can no longer be abandoned
            self.records.release(entry.prev)
            entry.prev = None
        entry.worker = worker
        worker.entry = entry
        worker.jobs += 1
        worker.started = now
        spec = entry.lane.spec
        timeout = entry.timeout if entry.timeout is not None else spec.timeout
        if timeout is not None and not spec.remote:  # (a remote lane's time runs where its job runs)
            self.timers.limit(entry, now + timeout)

    def unstart(self, entry: Entry, now: float) -> None:
        """``entry`` was given to a worker that died before it started the
        job (see ``Dispatch.died``): Pending again, its attempt not counted,
        its time limit not running. The caller puts it back in its lane."""
        self._move(entry, PENDING, now, ran=False)
        entry.pid = None
        entry.worker = None
        entry.deadline = None
        entry.unstarted += 1

    def finish(self, entry: Entry, outcome: Completed[Any] | Failed, now: float) -> list[Wakeup]:
        """An attempt ended (its worker is already released): settle the entry,
        or, for a failure its Retry covers, schedule the next attempt and keep
        the key live."""
        retry = entry.job.retry
        if (
            retry is None
            or type(outcome) is not Failed
            or outcome.failure.kind not in retry.on
            or entry.attempt >= retry.attempts
            or self.cancelled
            or self.stopped
        ):
            return self.settle(entry, outcome, now)
        if entry.history is None:
            entry.history = []
        entry.history.append(outcome.failure)
        delay = retry.delay(entry.attempt, self._random.random())
        entry.attempt += 1
        entry.job_id = next(self._ids)
        self._move(entry, PENDING, now)
        entry.worker = None
        entry.kill_reason = None
        entry.deadline = None
        self.timers.wait(entry, now + delay)
        return []

    def settle(self, entry: Entry, outcome: Completed[Any] | Failed, now: float) -> list[Wakeup]:
        """Make ``outcome`` final for a live entry and record it; return its wake-ups."""
        if entry.history and type(outcome) is Failed:
            outcome = Failed(_summarize(entry.history, outcome.failure))
        entry.outcome = outcome
        self._move(entry, DONE, now)
        records = self.records
        if entry.prev is not None:  # ended before it ever ran (cancelled, lane failed)
            records.release(entry.prev)
            entry.prev = None
        records.record(entry.key, outcome, entry.fp, now, entry.face)
        return self._ended(entry)

    def abandon(self, entry: Entry, why: str, now: float) -> list[Wakeup]:
        """Put the key back to what it was before ``entry`` claimed it, and
        wake whoever joined the claim with ``cancelled``."""
        assert entry.status is PENDING and entry.outcome is None
        entry.outcome = Failed(Failure("cancelled", f"job {entry.key!r} was abandoned before it ran: {why}"))
        self._move(entry, ABANDONED, now)
        if entry.prev is not None:
            self.records.give_back(entry.prev, now)
            entry.prev = None
        return self._ended(entry)

    def _ended(self, entry: Entry) -> list[Wakeup]:
        """Let go of what an ended entry needs no more; return its wake-ups."""
        entry.worker = None
        entry.timed = False
        # Handles may live on, and a program often keeps thousands: they need
        # the key and the outcome, not the payload nor the Job (which, with its
        # dict, is two more objects per handle for the garbage collector to
        # walk over and over). Read only while the entry is live.
        del entry.job
        entry.fn_bytes = entry.args_bytes = b""
        # The handles' stand-in may keep referring to the entry (a failure, or
        # an outcome a store has yet to commit, is read there): the entry no
        # longer refers to it, so the two make no cycle, which would hold the
        # outcome (a result mapped from shared memory) until the garbage
        # collector ran. A handle made from now on holds a stand-in of its own.
        entry.face = None
        wakeups: list[Wakeup] = []
        if entry.segment is not None:  # given back with no lock held, as a wake-up
            wakeups.append(entry.segment.release)
            entry.segment = None
        if entry.event is not None:
            wakeups.append(entry.event.set)
        if entry.callbacks:
            wakeups.extend(entry.callbacks)
            entry.callbacks = None
        if not self.live and self.closing:
            wakeups.append(self.drained.set)
        return wakeups

    # --- reading ----------------------------------------------------------------------

    def forget(self, key: str, now: float) -> bool:
        """Drop an ended key. False if the map holds no such key; raises
        ``ValueError`` for a live one."""
        entry = self.live.get(key)
        if entry is not None:
            state = "running" if entry.status is PROCESSING else "pending"
            raise ValueError(
                f"cannot forget key {key!r}: it is live ({state}); only a key that ended "
                "(completed or failed) can be forgotten"
            )
        rec = self.records.lookup(key, now)
        if rec is None:
            return False
        self.records.drop(rec)
        return True

    def sweep(self, now: float) -> None:
        """Reclaim the records whose time is up (amortised O(1) per key)."""
        if self.records.timed:
            self.records.sweep(now)

    def stats(self, now: float, lanes: dict[str, LaneStats]) -> QueueStats:
        """Counts of keys per state, with the lanes' own counts."""
        self.sweep(now)
        pending = len(self.live) - self.processing
        return QueueStats(pending, self.processing, self.records.completed, self.records.failed, lanes)

    def snapshot(self, prefix: str | None, kinds: tuple[type, ...] | None, now: float) -> list[Entry | Ended]:
        """Every key (with ``prefix``, in a state of ``kinds``), sorted, as its
        live entry or an ``Ended`` stand-in for its record."""
        self.sweep(now)
        found: list[Entry | Ended] = []
        for key, entry in self.live.items():
            if (prefix is None or key.startswith(prefix)) and (kinds is None or type(entry.state()) in kinds):
                found.append(entry)
        completed = kinds is None or Completed in kinds
        failed = kinds is None or Failed in kinds
        if completed or failed:
            ended = self.records.scan(prefix, now, completed, failed)
            found.extend(Ended(rec[KEY], record_state(rec)) for rec in ended)
        found.sort(key=lambda e: e.key)
        return found

    def state(self, key: str, now: float) -> State | None:
        self.sweep(now)
        current = self.lookup(key, now)
        if current is None:
            return None
        if type(current) is Entry:
            return current.state()
        self.records.used(current)  # type: ignore[arg-type]
        return record_state(current)  # type: ignore[arg-type]

    def check(self) -> None:
        """Assert the map's invariants (for ``Core._check_invariants``)."""
        processing = memory = 0
        for key, entry in self.live.items():
            assert entry.key == key
            assert entry.outcome is None and entry.status in (PENDING, PROCESSING), key
            assert not entry.timed or (entry.status is PENDING and entry.due is not None), key
            assert entry.status is PENDING or entry.prev is None, key
            assert self.records.peek(key) is None, key
            if entry.status is PROCESSING:
                processing += 1
                memory += entry.memory_limit is not None
        assert (processing, memory) == (self.processing, self.memory_jobs), (processing, memory)
        self.records.check()
        self.timers.check(self.live)


def _describe(exc: BaseException) -> str:
    """``exc`` in a message: its type and text."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _summarize(history: list[Failure], last: Failure) -> Failure:
    """The final failure of a job that ran more than once: the last attempt's,
    saying how many ran and why each failed."""
    every = (*history, last)
    n = len(every)
    why = "; ".join(f"#{i} {f}" for i, f in enumerate(every, 1))
    return replace(last, message=f"{last.message} [{n} attempts, all failed: {why}]", attempts=n, history=every)
