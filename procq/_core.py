"""The engine's I/O-free core: the state map, the lanes' queues, every state change.

Both faces (the blocking one and the asyncio one in ``_queue.py``) and the
supervisor's I/O thread (``_supervisor.py``) change state only through the
methods here. Nothing here touches a pipe or a process: methods that decide
something another party must act on return it (a worker to send a job to, a
list of wake-ups to run) and the caller acts once the lock is released.
``Core`` has three mixins, each a module of its own: ``_dispatch.Dispatch``
(handing jobs to workers, several in flight per worker, what a worker's
reports and death do), ``_ended.EndedKeys`` (the ended keys and their
retention) and ``_stopping.Stopping`` (ending jobs from outside: time and
memory limits, ``q.cancel``, closing without waiting). Its
bookkeeping objects (an entry, a worker slot, a lane) are in ``_entries``.

One lock
--------
``Core.lock`` guards everything below: the state map, each lane's queues and
worker slots, each live entry's waiters, the timers and the retention
bookkeeping. One lock, not a state-map lock plus a waiter lock, because every
transition touches both and two locks would only add an ordering rule to get
wrong. It is held for a few dict and deque operations at a time; never across
user code, pickling, a pipe send or an await, and no wake-up (event set,
callback, future resolution) runs under it.

Life of a key
-------------
::

    absent / ended ──claim──> Pending ──(due)──> in its lane ──assign──> Processing ──finish──> Completed | Failed
                                 │  ^                                        │
                                 │  └──── retry: Pending(attempt + 1), ──────┤ (a failed attempt,
                                 │        back to its timer (backoff)        │  with a Retry left)
                                 │ abandon                                   │ (worker dies: "crashed";
                                 v                                           │  deadline: "timeout")
                       back to what it was                                   v
                       (joiners: Failed "cancelled")                        ...

``_keys[key]`` is an ``Entry`` while the key is live (Pending or Processing)
and a record after (``_retention.Done`` / ``Fell``), until retention drops it.
Which ended keys are answered from their record and which run again is the
reuse policy (``Job.reuse``).

Time
----
Entries waiting for a time (``Job.not_before``, a retry backoff) sit in
``_timers``, a heap the supervisor's I/O thread sleeps towards, like the
running jobs' deadlines: ``next_deadline`` is the nearest of both and
``on_new_deadline`` wakes the thread when a push adds an earlier one. No
thread polls. A timer that falls due is offered to its lane like a push
(``_enter_lane``): to an idle worker, into ``ready``, or, when ``ready`` is
full, into ``overdue``, which is served before pushes blocked for room.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Union

from procq._dispatch import Dispatch, _low_mark
from procq._ended import EndedKeys
from procq._entries import (
    ABANDONED,
    DONE,
    PENDING,
    PROCESSING,
    Ended,
    Entry,
    LaneState,
    WorkerSlot,
    current_timer,
    run_wakeups,
)
from procq._errors import QueueClosed
from procq._job import Job, Lane, Retention
from procq._retention import Done, Fell, Keeper, Record
from procq._stopping import Stopping
from procq._values import (
    Completed,
    Failed,
    Failure,
    LaneStats,
    QueueStats,
    State,
)

__all__ = ["Claim", "Core", "Ended", "Entry", "LaneState", "WorkerSlot", "run_wakeups"]

Wakeup = Callable[[], None]


# Results of Core.offer.
QUEUED = "queued"  # accepted into the lane's ready queue
FULL = "full"  # no room; nothing changed
BLOCKED = "blocked"  # no room; the push now waits in the lane's blocked queue
STOPPED = "stopped"  # the supervisor has stopped: nothing will ever run the job
CANCELLED = "cancelled"  # q.cancel() came before the lane: the job ended, cancelled
SCHEDULED = "scheduled"  # waits for its not_before time, then enters its lane

Offer = Union[WorkerSlot, str]

#: What ``claim_all`` answers per job: (kind, value, conflict). kind is
#: "queued" (value: a new Entry), "inflight" (the live Entry), "cached" (the
#: output) or "failed" (the Failure of a key that never runs again). conflict
#: is None or (what differs, the holder's function or None when only a record
#: is left).
Claim = tuple[str, Any, Union[tuple[str, Any], None]]


class Core(Dispatch, EndedKeys, Stopping):
    """The state map and the lanes. Every method takes ``lock`` itself."""

    def __init__(
        self,
        lanes: dict[str, Lane],
        retention: Retention | None = None,
        reuse: str = "failed",
        check_payload: bool = True,
        strict_payload: bool = True,
    ) -> None:
        self.lock = threading.Lock()
        self.clock: Callable[[], float] = time.monotonic  # monotonic seconds: deadlines and timers
        self.lanes = {name: LaneState(name, spec) for name, spec in lanes.items()}
        self.default_lane = next(iter(self.lanes.values()))
        self._keys: dict[str, Entry | Record] = {}
        self._ids = itertools.count(1)
        self.reuse = reuse  # the queue's default reuse policy
        self.check_payload = check_payload  # fingerprints are kept and compared
        self.strict_payload = strict_payload  # a conflict refuses the claim (on_mismatch="raise")
        self.keeper = Keeper(retention or Retention(), lambda rec: self._keys.get(rec.key) is rec)
        self.closing = False
        self.stopped = False  # the supervisor stopped: offer() refuses everything
        self.cancelled = False  # close(wait=False) began: offer() refuses everything
        # Counts of keys per state, kept in step with _keys (see _check_invariants).
        self._pending = 0
        self._processing = 0
        self._completed = 0
        self._failed = 0
        self._live = 0  # claims not yet DONE: pending (in a lane or not yet) or processing
        self.drained = threading.Event()  # set while closing and nothing is live
        # Deadlines of running jobs with a timeout: (deadline, job_id, entry).
        self._deadlines: list[tuple[float, int, Entry]] = []
        # Entries waiting for their time: (due, job_id, entry). An item is
        # current while its entry is timed and its due equals the item's.
        self._timers: list[tuple[float, int, Entry]] = []
        self._random = random.Random()
        # Called (no lock held) when a new deadline may be earlier than the one
        # the I/O thread is sleeping towards.
        self.on_new_deadline: Wakeup = lambda: None
        # Running jobs with a memory limit: while there are any, the I/O
        # thread samples their process trees' memory.
        self.memory_jobs = 0
        # Jobs given to idle workers while the I/O thread handled a death (see handoffs).
        self._handoffs: list[tuple[WorkerSlot, Entry]] = []

    # --- claiming -----------------------------------------------------------

    def lane_for(self, job: Job[Any]) -> LaneState:
        if job.lane is None:
            return self.default_lane
        lane = self.lanes.get(job.lane)
        if lane is None:
            known = ", ".join(repr(n) for n in self.lanes)
            raise ValueError(f"job {job.key!r}: unknown lane {job.lane!r}; this queue's lanes are {known}")
        return lane

    def claim(self, job: Job[Any], lane: LaneState, fp: bytes | None = None, due: float | None = None) -> Claim:
        """Check and claim ``job.key`` in one critical section (``claim_all``
        for one job: a conflict claims nothing)."""
        if not self.keeper.active and not self.closing:
            # A completed key, with no retention to consult or update: its
            # record never changes in place, and a dict read is atomic, so it
            # answers without the lock (the read is the push's moment). Many
            # threads pushing cached keys then never queue on the lock.
            current = self._keys.get(job.key)
            if type(current) is Done and (job.reuse or self.reuse) != "always":
                held = current.fp
                if held == fp or held is None or fp is None:
                    return "cached", current.output, None
                return "cached", current.output, self._conflict(held, fp, None)
        now = time.monotonic() if due is not None else 0.0
        kept = self.keeper.clock()
        with self.lock:
            if self.closing:
                raise QueueClosed(f"the queue is closed; cannot push job {job.key!r}")
            if self.keeper.timed:
                self._sweep(kept)
            return self._claim(job, lane, fp, due, now, kept)

    def claim_all(self, items: list[tuple[Job[Any], LaneState, bytes | None, float | None]]) -> tuple[list[Claim], int | None]:
        """Check and claim every job's key in one critical section.

        Returns a ``Claim`` per job and the index of the first job whose
        payload conflicts with its key's holder. With ``strict_payload`` a
        conflict claims nothing at all (the claims made before it in the batch
        are taken back: nobody can have joined them, the lock was held
        throughout) and the list stops there. A new entry is PENDING and in no
        lane yet: the caller must ``offer`` it or ``abandon`` it. A key that
        appears twice resolves the second job to the first's claim.
        """
        now = time.monotonic()
        claims: list[Claim] = []
        kept = self.keeper.clock()
        fresh: list[Entry] = []
        conflict_at: int | None = None
        with self.lock:
            if self.closing:
                raise QueueClosed(f"the queue is closed; cannot push job {items[0][0].key!r}")
            self._sweep(kept)
            for i, (job, lane, fp, due) in enumerate(items):
                claim = self._claim(job, lane, fp, due, now, kept)
                if claim[2] is not None and conflict_at is None:
                    conflict_at = i
                    if self.strict_payload:
                        for entry in reversed(fresh):
                            self._abandon(entry, "its batch was refused")
                        claims.append(claim)
                        return claims, conflict_at
                if claim[0] == "queued":
                    fresh.append(claim[1])
                claims.append(claim)
        return claims, conflict_at

    def _claim(
        self, job: Job[Any], lane: LaneState, fp: bytes | None, due: float | None, now: float, kept: float
    ) -> Claim:
        key = job.key
        current = self._lookup(key, kept)
        if type(current) is Entry:
            return "inflight", current, self._conflict(current.fp, fp, current.job.fn)
        reuse = job.reuse or self.reuse
        if type(current) is Done:
            if reuse != "always":
                conflict = self._conflict(current.fp, fp, None)
                if conflict is None or not self.strict_payload:
                    self.keeper.used(current)
                return "cached", current.output, conflict
        elif type(current) is Fell and reuse == "never":
            return "failed", current.failure, self._conflict(current.fp, fp, None)
        entry = Entry(job, lane, next(self._ids), current)  # type: ignore[arg-type]
        entry.fp = fp if self.check_payload else None
        if due is not None and due > now:
            entry.due = due
        self._keys[key] = entry
        if current is not None:
            self._detach(current)  # type: ignore[arg-type]
        self._pending += 1
        self._live += 1
        return "queued", entry, None

    def _conflict(self, held: bytes | None, pushed: bytes | None, held_fn: Any) -> tuple[str, Any] | None:
        if held is None or pushed is None:
            return None
        if held[:8] != pushed[:8]:
            return "function", held_fn
        if len(held) == 16 and len(pushed) == 16 and held != pushed:
            return "arguments", held_fn
        return None

    def offer(self, entry: Entry, blocked_wakeup: Wakeup | None = None) -> Offer:
        """Hand a claimed entry to its lane.

        Returns the ``WorkerSlot`` the caller must now send the job to (an
        idle worker took it), ``QUEUED`` (it waits in the lane), ``SCHEDULED``
        (it waits for its time first), or, when the lane is full, ``FULL``
        (nothing changed) or, given ``blocked_wakeup``, ``BLOCKED``: the entry
        waits for room and ``blocked_wakeup`` runs once it has been accepted
        (see ``unblock``).
        """
        lane = entry.lane
        result: Offer
        with self.lock:
            if self.stopped or self.cancelled:
                return STOPPED
            if entry.kill_reason is not None:  # q.cancel() came while its push pickled it
                self._pending -= 1
                wakeups = self._settle(entry, Failed(entry.kill_reason))
                result, wake = CANCELLED, False
            elif entry.due is not None and entry.due > time.monotonic():
                wakeups = []
                self._set_timer(entry, entry.due)
                result, wake = SCHEDULED, True
            else:
                wakeups = []
                entry.due = None
                if lane.idle:
                    worker = lane.idle.pop()
                    self._assign(worker, entry)
                    result, wake = worker, entry.deadline is not None or entry.memory_limit is not None
                elif not lane.blocked and len(lane.ready) + lane.prefetched < lane.spec.capacity:
                    # (Never past a blocked push: pushes enter in arrival order.)
                    lane.ready.append(entry)
                    return QUEUED
                elif blocked_wakeup is None:
                    return FULL
                else:
                    lane.blocked.append((entry, blocked_wakeup))
                    return BLOCKED
        run_wakeups(wakeups)
        if wake:
            self.on_new_deadline()
        return result

    def wake(self, entry: Entry, target: float) -> WorkerSlot | None:
        """Move a holder waiting for its ``not_before`` time earlier, to
        ``target`` (monotonic). Never later, never a holder waiting out a retry
        backoff (``attempt > 1``), never one already in its lane or running:
        those are no-ops, so repeated wakes are too. A holder now due enters
        its lane at once; returns the worker to send it to, if an idle one
        took it."""
        with self.lock:
            if entry.outcome is not None or entry.status != PENDING or entry.attempt > 1:
                return None
            if entry.due is None or target >= entry.due:
                return None
            if not entry.timed:  # its pusher has not offered it yet: offer() sees the new time
                entry.due = target
                return None
            if target > time.monotonic():
                self._set_timer(entry, target)
                worker = None
            else:
                entry.timed = False
                entry.due = None
                worker = self._enter_lane(entry)
            wake = worker is None or entry.deadline is not None or entry.memory_limit is not None
        if wake:
            self.on_new_deadline()
        return worker

    def unblock(self, entry: Entry, why: str) -> str:
        """A blocked push stops waiting. Returns "abandoned" when the entry
        never reached its lane: it was still blocked and its claim is now
        released (see ``_abandon``), or ``cancel_all`` released it. Returns
        "accepted" when the lane took it first: the push succeeded after all."""
        with self.lock:
            if entry.status == ABANDONED:
                return "abandoned"
            blocked = entry.lane.blocked
            for i, (e, _) in enumerate(blocked):
                if e is entry:
                    del blocked[i]
                    wakeups = self._abandon(entry, why)
                    break
            else:
                return "accepted"
        run_wakeups(wakeups)
        return "abandoned"

    def abandon(self, entry: Entry, why: str) -> None:
        """Release a claim that was never offered to its lane."""
        self.abandon_all([entry], why)

    def abandon_all(self, entries: list[Entry], why: str) -> None:
        """Release claims that were never offered to their lanes, last first
        (so a key claimed twice in a batch goes back to what it was at first)."""
        wakeups: list[Wakeup] = []
        with self.lock:
            for entry in reversed(entries):
                if entry.status == PENDING and entry.outcome is None and not entry.timed:
                    wakeups += self._abandon(entry, why)
        run_wakeups(wakeups)

    def _abandon(self, entry: Entry, why: str) -> list[Wakeup]:
        """Put the key back to what it was before ``entry`` claimed it, and
        wake whoever joined the claim with ``cancelled`` (lock held)."""
        assert entry.status == PENDING and entry.outcome is None
        prev = entry.prev
        entry.prev = None
        if prev is None or self.keeper.expired(prev, self.keeper.clock()):
            del self._keys[entry.key]
            if prev is not None:
                self.keeper.dropped(prev)
        else:
            self._keys[entry.key] = prev
            self._count(prev, 1)
            for old in self.keeper.restored(prev):
                self._drop(old)
        self._pending -= 1
        failure = Failure("cancelled", f"job {entry.key!r} was abandoned before it ran: {why}")
        wakeups = self._settle(entry, Failed(failure), count=False)
        entry.status = ABANDONED
        return wakeups

    def _set_timer(self, entry: Entry, due: float) -> None:
        entry.due = due
        entry.timed = True
        heapq.heappush(self._timers, (due, entry.job_id, entry))

    # --- finishing ----------------------------------------------------------

    def _settle(self, entry: Entry, outcome: Completed[Any] | Failed, count: bool = True) -> list[Wakeup]:
        """Make ``outcome`` final for ``entry`` (lock held); return its wake-ups."""
        if entry.history and type(outcome) is Failed:
            outcome = Failed(_summarize(entry.history, outcome.failure))
        entry.outcome = outcome
        entry.status = DONE
        entry.worker = None
        entry.timed = False
        entry.fn_bytes = entry.args_bytes = b""  # handles may live on; the payload need not
        self._live -= 1
        if count:
            if entry.prev is not None:  # ended before it ever ran (cancelled, lane failed)
                self.keeper.dropped(entry.prev)
                entry.prev = None
            at = self.keeper.stamp(self.keeper.clock())
            rec: Record
            if type(outcome) is Completed:
                rec = Done(entry.key, outcome.output, entry.fp, at)
                entry.lane.completed += 1
            else:
                rec = Fell(entry.key, outcome.failure, entry.fp, at)  # type: ignore[union-attr]
                entry.lane.failed += 1
            self._keys[entry.key] = rec
            self._count(rec, 1)
            for old in self.keeper.added(rec):
                self._drop(old)
        wakeups: list[Wakeup] = []
        if entry.event is not None:
            wakeups.append(entry.event.set)
        if entry.callbacks:
            wakeups.extend(entry.callbacks)
            entry.callbacks = None
        if self._live == 0 and self.closing:
            wakeups.append(self.drained.set)
        return wakeups

    def _end(self, entry: Entry, outcome: Completed[Any] | Failed) -> list[Wakeup]:
        """An attempt ended (its worker is already released; lock held):
        settle the entry, or, for a failure its Retry covers, schedule the
        next attempt and keep the key live."""
        retry = entry.job.retry
        if (
            retry is None
            or type(outcome) is not Failed
            or outcome.failure.kind not in retry.on
            or entry.attempt >= retry.attempts
            or self.cancelled
            or self.stopped
        ):
            return self._settle(entry, outcome)
        if entry.history is None:
            entry.history = []
        entry.history.append(outcome.failure)
        delay = retry.delay(entry.attempt, self._random.random())
        entry.attempt += 1
        entry.job_id = next(self._ids)
        entry.status = PENDING
        entry.worker = None
        entry.kill_reason = None
        entry.deadline = None
        entry.lane.retries += 1
        self._pending += 1
        self._set_timer(entry, time.monotonic() + delay)
        return []












    # --- time: deadlines of running jobs, timers of waiting ones -----------------

    def next_deadline(self) -> float | None:
        """The nearest running job's deadline or waiting job's due time."""
        with self.lock:
            heap = self._deadlines
            while heap and (heap[0][2].status != PROCESSING or heap[0][2].deadline != heap[0][0]):
                heapq.heappop(heap)
            timers = self._timers
            while timers and not current_timer(timers[0]):
                heapq.heappop(timers)
            times = [h[0][0] for h in (heap, timers) if h]
            return min(times) if times else None

    def due(self, now: float) -> list[tuple[WorkerSlot, Entry]]:
        """Entries whose time has come enter their lanes. Returns the jobs the
        caller must send, each with the idle worker that took it."""
        sends: list[tuple[WorkerSlot, Entry]] = []
        with self.lock:
            if self.stopped or self.cancelled:
                return sends
            timers = self._timers
            while timers and timers[0][0] <= now:
                item = heapq.heappop(timers)
                if not current_timer(item):
                    continue
                entry = item[2]
                entry.timed = False
                entry.due = None
                worker = self._enter_lane(entry)
                if worker is not None:
                    sends.append((worker, entry))
        return sends

    # --- closing ------------------------------------------------------------

    def stop(self) -> None:
        """The supervisor is stopping: no entry may enter a lane any more."""
        with self.lock:
            self.closing = True
            self.stopped = True

    def start_closing(self) -> None:
        with self.lock:
            self.closing = True
            if self._live == 0:
                self.drained.set()

    # --- waiting on an entry ----------------------------------------------------

    def wait_event(self, entry: Entry) -> threading.Event | None:
        """An event set when ``entry`` is DONE, or None if it already is."""
        with self.lock:
            if entry.outcome is not None:
                return None
            if entry.event is None:
                entry.event = threading.Event()
            return entry.event

    def add_callback(self, entry: Entry, callback: Wakeup) -> bool:
        """Run ``callback`` (from some thread, no lock held) when ``entry`` is
        DONE. False, and nothing registered, if it already is."""
        with self.lock:
            if entry.outcome is not None:
                return False
            if entry.callbacks is None:
                entry.callbacks = []
            entry.callbacks.append(callback)
            return True

    # --- reading ------------------------------------------------------------

    def state(self, key: str) -> State | None:
        with self.lock:
            now = self.keeper.clock()
            self._sweep(now)
            current = self._lookup(key, now)
            if current is None:
                return None
            if isinstance(current, Entry):
                return current.state()
            self.keeper.used(current)
        return current.state()

    def stats(self) -> QueueStats:
        with self.lock:
            self._sweep(self.keeper.clock())
            lanes = {
                name: LaneStats(
                    name=name,
                    workers=lane.spec.workers,
                    capacity=lane.spec.capacity,
                    waiting=len(lane.ready) + lane.prefetched + len(lane.overdue) + len(lane.blocked),
                    running=lane.running,
                    workers_alive=len(lane.workers) + lane.starting,
                    crashes=lane.crashes,
                    worker_restarts=lane.restarts,
                    completed=lane.completed,
                    failed=lane.failed,
                    retries=lane.retries,
                )
                for name, lane in self.lanes.items()
            }
            return QueueStats(
                pending=self._pending,
                processing=self._processing,
                completed=self._completed,
                failed=self._failed,
                lanes=lanes,
            )

    def live_count(self) -> int:
        with self.lock:
            return self._live

    def _check_invariants(self) -> None:
        """Assert the relations between fields that the code relies on (for tests)."""
        with self.lock:
            counts = {PENDING: 0, PROCESSING: 0}
            completed = failed = 0
            for key, value in self._keys.items():
                if type(value) is Entry:
                    assert value.key == key
                    assert value.outcome is None and value.status in (PENDING, PROCESSING), key
                    assert not value.timed or (value.status == PENDING and value.due is not None), key
                    assert value.status == PENDING or value.prev is None, key
                    counts[value.status] += 1
                elif type(value) is Done:
                    assert value.key == key
                    completed += 1
                else:
                    assert type(value) is Fell and value.key == key, (key, value)
                    failed += 1
            assert counts[PENDING] == self._pending, (counts, self._pending)
            assert counts[PROCESSING] == self._processing, (counts, self._processing)
            assert completed == self._completed and failed == self._failed
            self.keeper.check(completed)
            for item in self._timers:
                if current_timer(item):
                    assert self._keys.get(item[2].key) is item[2]
            for lane in self.lanes.values():
                assert len(lane.ready) + lane.prefetched <= lane.spec.capacity
                assert not lane.blocked or len(lane.ready) + lane.prefetched > _low_mark(lane.spec.capacity)
                assert not lane.overdue or len(lane.ready) + lane.prefetched == lane.spec.capacity
                assert lane.prefetched == sum(len(w.queue) for w in lane.workers)
                for w in lane.workers:
                    assert not w.queue or w.entry is not None
                    for e in w.queue:
                        assert e.status == PENDING and e.worker is w and self._keys.get(e.key) is e
                assert not lane.idle or not (lane.ready or lane.overdue), lane.name
                assert len(lane.workers) + lane.starting <= lane.spec.workers
                busy = [w for w in lane.workers if w.entry is not None]
                assert len(busy) == lane.running
                for w in lane.idle:
                    assert w.entry is None and w in lane.workers
                for w in busy:
                    assert w.entry is not None and w.entry.status == PROCESSING
                    assert self._keys.get(w.entry.key) is w.entry
                for e in (*lane.ready, *lane.overdue):
                    assert e.status == PENDING and not e.timed and self._keys.get(e.key) is e





def _summarize(history: list[Failure], last: Failure) -> Failure:
    """The final failure of a job that ran more than once: the last attempt's,
    saying how many ran and why each failed."""
    every = (*history, last)
    n = len(every)
    why = "; ".join(f"#{i} {f}" for i, f in enumerate(every, 1))
    return replace(last, message=f"{last.message} [{n} attempts, all failed: {why}]", attempts=n, history=every)
