"""The engine's I/O-free core: one lock, one clock, and the parts that change state.

Both faces (the blocking one and the asyncio one: ``_api.queue``, ``_api.push``) and the
supervisor's I/O thread (``_supervisor.py``) change state only through
``Core``'s methods. Nothing here touches a pipe or a process: methods that
decide something another party must act on return it (a worker to send a job
to, a list of wake-ups to run) and the caller acts once the lock is released.

``Core`` is thin: each method takes the lock, reads the clock, asks its parts
and runs the wake-ups after. The parts, each with its own state: ``keys``
(``_core.statemap.StateMap``: the live keys and every status change, with the counts
that follow it; the queue's door; ``records``, the ended keys, a
``_core.records.KeyRecords``), ``timers`` (``_core.timers.Timers``: due times and
deadlines), ``dispatch`` (``_core.dispatch.Dispatch``: the lanes and their workers,
jobs handed and sent ahead, a worker's reports, start and death) and
``stopping`` (``_core.stopping.Stopping``: time and memory limits, ``q.cancel``,
closing without waiting). Their bookkeeping objects are in ``_core.entries``.

**One lock.** ``Core.lock`` guards all of it: the state map, each lane's queues
and worker slots, each live entry's waiters, the timers and the records (every
transition touches several: more locks would only add an order to get wrong).
It is held for a few dict and deque operations at a time; never across user
code, pickling, a pipe send or an await, and no wake-up (event set, callback,
future resolution) runs under it (``deliver`` runs them after). The parts
never take it: ``Core`` holds it around every call.

**Time** comes from ``Core.clock`` (``time.monotonic`` unless given). No thread
polls: the I/O thread sleeps towards ``next_deadline``, woken by ``on_new_deadline``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from procq._core.answers import Offer, Offered, Reported, Unblocked
from procq._core.dispatch import Dispatch
from procq._core.entries import (
    ABANDONED,
    PENDING,
    Ended,
    Entry,
    Held,
    LaneState,
    Wakeup,
    WorkerLife,
    WorkerSlot,
    run_wakeups,
)
from procq._core.records import KeyRecords, MemoryRecords
from procq._core.spares import wanted
from procq._core.statemap import Claim, ClaimKind, StateMap
from procq._core.stopping import Stopping
from procq._core.timers import Timers
from procq._model.job import Job, Lane
from procq._model.policies import Retention
from procq._model.values import Completed, Failed, Failure, QueueStats, State
from procq._wire.fingerprint import job_fingerprint
from procq._wire.protocol import Report, Undecoded

__all__ = [
    "BLOCKED", "CANCELLED", "FULL", "QUEUED", "SCHEDULED", "STOPPED",
    "Claim", "Core", "Ended", "Entry", "Item", "LaneState", "Offer", "WorkerLife", "WorkerSlot", "run_wakeups",
]  # fmt: skip

#: A job to claim, its lane, and when it is due (None: now); see ``Core.claim``.
Item = tuple[Job[Any], LaneState, float | None]

# Results of Core.offer, besides a worker (see Offered).
QUEUED, FULL, BLOCKED = Offered.QUEUED, Offered.FULL, Offered.BLOCKED
STOPPED, CANCELLED, SCHEDULED = Offered.STOPPED, Offered.CANCELLED, Offered.SCHEDULED


class Core:
    """The engine's state, behind one lock (see the module docstring). Every method takes ``lock`` itself."""

    def __init__(
        self,
        lanes: dict[str, Lane],
        retention: Retention | None = None,
        reuse: str = "failed",
        check_payload: bool = True,
        strict_payload: bool = True,
        clock: Callable[[], float] = time.monotonic,
        records: KeyRecords | None = None,
    ) -> None:
        self.lock = threading.Lock()
        self.clock = clock
        self.check_payload = check_payload  # fingerprints are kept and compared
        self.strict_payload = strict_payload  # a conflict refuses the claim (on_mismatch="raise")
        self.timers = Timers()
        self.records: KeyRecords = records if records is not None else MemoryRecords(retention or Retention())
        self.keys = StateMap(self.records, self.timers, reuse, check_payload, strict_payload)
        self.dispatch = Dispatch(lanes, self.keys)
        self.stopping = Stopping(self.keys, self.timers, self.dispatch)
        self.lanes = self.dispatch.lanes
        self.lane_for = self.dispatch.lane_for  # (no lock: the lanes never change)
        self.default_lane = self.dispatch.default_lane
        self.drained = self.keys.drained  # set while closing and nothing is live
        # Called (no lock held) when a new deadline may be earlier than the I/O thread's. ``lead``:
        # a caller's wait on a running job, reading its worker's pipe itself (``_supervisor.lead``).
        self.on_new_deadline: Wakeup = lambda: None
        self.lead: Callable[[Entry, threading.Event, float | None], bool] | None = None

    @property  # the queue's door, as the faces and the supervisor read it (see StateMap)
    def closing(self) -> bool:
        return self.keys.closing

    @property
    def cancelled(self) -> bool:
        return self.keys.cancelled

    @property
    def memory_jobs(self) -> int:  # while there are any, the I/O thread samples memory
        return self.keys.memory_jobs

    def deliver(self, wakeups: list[Wakeup]) -> None:
        """Run wake-ups gathered under the lock, after it: every waiter's goes through here, so a
        core whose outcomes must first be durable (``_durable.core``) holds them back until they are."""
        run_wakeups(wakeups)

    # --- claiming -----------------------------------------------------------

    def claim(self, job: Job[Any], lane: LaneState, due: float | None = None) -> Claim:
        """Check and claim ``job.key`` in one critical section (``claim_all``
        for one job: a conflict claims nothing). The core fingerprints the
        job itself: a store's claim of a completed key needs no fingerprint."""
        fp = job_fingerprint(job) if self.check_payload else None
        keys = self.keys
        if not self.records.expires and not keys.closing and (cached := keys.cached(job, lane, fp)) is not None:
            return cached  # (without the lock: see StateMap.cached)
        now = self.clock()
        with self.lock:
            keys.sweep(now)
            return keys.claim(job, lane, fp, due, now)

    def claim_all(self, items: list[Item]) -> tuple[list[Claim], int | None]:
        """Check and claim every job's key in one critical section: a ``Claim``
        per job (a new entry is to be offered or abandoned; a key that appears
        twice resolves to its first claim), and the index of the first job
        whose payload conflicts with its key's holder. With ``strict_payload``
        a conflict claims nothing at all (the batch's claims made before it
        are taken back: the lock was held throughout) and the list stops there."""
        keys = self.keys
        claims: list[Claim] = []
        fresh: list[Entry] = []
        conflict_at: int | None = None
        fps = [job_fingerprint(job) if self.check_payload else None for job, _, _ in items]
        now = self.clock()
        with self.lock:
            keys.sweep(now)
            for i, ((job, lane, due), fp) in enumerate(zip(items, fps, strict=True)):
                claim = keys.claim(job, lane, fp, due, now)
                if claim.conflict is not None and conflict_at is None:
                    conflict_at = i
                    if self.strict_payload:
                        for entry in reversed(fresh):
                            keys.abandon(entry, "its batch was refused", now)
                        claims.append(claim)
                        return claims, conflict_at
                if claim.kind is ClaimKind.QUEUED:
                    fresh.append(claim.value)
                claims.append(claim)
        return claims, conflict_at

    def offer(self, entry: Entry, blocked_wakeup: Wakeup | None = None) -> Offer:
        """Hand a claimed entry to its lane. Returns the ``WorkerSlot`` the
        caller must now send the job to (an idle worker took it), ``QUEUED``,
        ``SCHEDULED`` (it waits for its time first), or, when the lane is full,
        ``FULL`` (nothing changed) or, given ``blocked_wakeup``, ``BLOCKED``: it
        waits for room and ``blocked_wakeup`` runs once it is accepted."""
        keys = self.keys
        with self.lock:
            if keys.stopped or keys.cancelled:
                return STOPPED
            if entry.kill_reason is not None:  # q.cancel() came while its push pickled it
                wakeups = keys.settle(entry, Failed(entry.kill_reason), self.clock())
                result: Offer = CANCELLED
                wake = False
            elif entry.due is not None and entry.due > self.clock():
                self.timers.wait(entry, entry.due)
                wakeups = None
                result, wake = SCHEDULED, True
            else:
                entry.due = None
                result = self.dispatch.admit(entry, blocked_wakeup, self.clock)
                if type(result) is not WorkerSlot:
                    return result
                wakeups = None
                wake = entry.deadline is not None or entry.memory_limit is not None
        if wakeups:
            self.deliver(wakeups)
        if wake:
            self.on_new_deadline()
        return result

    def wake(self, entry: Entry, target: float) -> WorkerSlot | None:
        """Move a holder waiting for its ``not_before`` time earlier, to
        ``target``; never later, never a retry's backoff, never one in its lane
        or running (no-ops, so repeated wakes are too). Now due, it enters its
        lane at once: returns the worker to send it to, if an idle one took it."""
        with self.lock:
            if entry.outcome is not None or entry.status is not PENDING or entry.attempt > 1:
                return None
            if entry.due is None or target >= entry.due:
                return None
            if not entry.timed:  # its pusher has not offered it yet: offer() sees the new time
                entry.due = target
                return None
            now = self.clock()
            if target > now:
                self.timers.wait(entry, target)
                worker = None
            else:
                entry.timed = False
                entry.due = None
                worker = self.dispatch.enter_lane(entry, now)
            wake = worker is None or entry.deadline is not None or entry.memory_limit is not None
        if wake:
            self.on_new_deadline()
        return worker

    def unblock(self, entry: Entry, why: str) -> Unblocked:
        """A blocked push stops waiting. Returns ``ABANDONED`` when the entry
        never reached its lane: it was still blocked and its claim is now
        released (see ``abandon``), or ``cancel_all`` released it. Returns
        ``ACCEPTED`` when the lane took it first: the push succeeded after all."""
        with self.lock:
            if entry.status is ABANDONED:
                return Unblocked.ABANDONED
            if not self.dispatch.unblock(entry):
                return Unblocked.ACCEPTED
            wakeups = self.keys.abandon(entry, why, self.clock())
            self._given_back([entry])
        self.deliver(wakeups)
        return Unblocked.ABANDONED

    def abandon(self, entry: Entry, why: str) -> None:
        """Release a claim that was never offered to its lane."""
        self.abandon_all([entry], why)

    def abandon_all(self, entries: list[Entry], why: str) -> None:
        """Release claims that were never offered to their lanes, last first
        (so a key claimed twice in a batch goes back to what it was at first)."""
        wakeups: list[Wakeup] = []
        with self.lock:
            now = self.clock()
            for entry in reversed(entries):
                if entry.status is PENDING and entry.outcome is None and not entry.timed:
                    wakeups += self.keys.abandon(entry, why, now)
            self._given_back(entries)
        self.deliver(wakeups)

    def _given_back(self, entries: list[Entry]) -> None:  # a store's core restores their rows
        """Claims just abandoned, under the lock."""

    # --- time: deadlines of running jobs, timers of waiting ones ---------------------

    def next_deadline(self) -> float | None:
        """The nearest running job's deadline or waiting job's due time."""
        with self.lock:
            return self.timers.next()

    def due(self, now: float) -> list[tuple[WorkerSlot, Entry]]:
        """Entries whose time has come enter their lanes: the jobs idle workers took, to send."""
        sends: list[tuple[WorkerSlot, Entry]] = []
        with self.lock:
            if self.keys.stopped or self.keys.cancelled:
                return sends
            for entry in self.timers.due(now):
                worker = self.dispatch.enter_lane(entry, now)
                if worker is not None:
                    sends.append((worker, entry))
        return sends

    # --- a worker's life and reports -------------------------------------------------

    def add_worker(self, worker: WorkerSlot | None, lane: LaneState, reserved: bool) -> bool:
        """A worker process joined ``lane`` (``None``: starting it failed); True: a spare (``Dispatch.add_worker``)."""
        with self.lock:
            return self.dispatch.add_worker(worker, lane, reserved)

    def reserve_restart(self, lane: LaneState) -> None:
        """Replace a worker of ``lane`` (``Dispatch.replace``): a promoted spare's job is in ``handoffs``."""
        wakeups: list[Wakeup] = []
        with self.lock:
            self.dispatch.replace(lane, self.clock(), wakeups)
        self.deliver(wakeups)

    def starts_wanted(self, lane: LaneState, spares: bool) -> int:
        """How many processes ``lane`` wants started (``_core.spares.wanted``)."""
        with self.lock:
            return wanted(lane, spares)

    def worker_ready(self, worker: WorkerSlot) -> Entry | None:
        """A worker finished starting. Returns a job to send it, if one waits."""
        wakeups: list[Wakeup] = []
        with self.lock:
            nxt = self.dispatch.ready(worker, self.clock(), wakeups)
            wake = nxt is not None and (nxt.deadline is not None or nxt.memory_limit is not None)
        self.deliver(wakeups)
        if wake:
            self.on_new_deadline()
        return nxt

    def doom(self, worker: WorkerSlot) -> None:
        """Give ``worker`` no more jobs: it is dying or being killed."""
        with self.lock:
            worker.doom()

    def sent(self, worker: WorkerSlot, n: int = 1) -> bool:
        """A sender is done with ``worker``'s pipe (``n`` rights to send, used
        for one frame). True: the worker died, or was retired and its pipe
        is out of the selector, or the queue stopped; the caller, the last
        sender, must close the pipe."""
        with self.lock:
            worker.sending -= n
            life = worker.life
            gone = life is WorkerLife.DEAD or (life is WorkerLife.RETIRED and worker.unwatched) or self.keys.stopped
            return gone and worker.sending == 0

    def jobs_done(
        self, worker: WorkerSlot, reports: list[Report], wakeups: list[Wakeup] | None = None,
        undecoded: list[tuple[Entry, Undecoded]] | None = None,
    ) -> tuple[list[Entry], Reported, int]:  # fmt: skip
        """A worker's reports, settled in one critical section (see
        ``Dispatch.reports``). Given ``wakeups``, the jobs' wake-ups go there
        for the caller to run (after it has sent the worker its next jobs,
        once for all the reports it read at once); else they run here. Jobs
        still ``Undecoded`` go in ``undecoded``, for a decode thread."""
        woken: list[Wakeup] = []
        with self.lock:
            later = [] if undecoded is None else undecoded
            batch, status, taken = self.dispatch.reports(worker, reports, self.clock(), woken, later)
        if wakeups is None:
            self.deliver(woken)
        else:
            wakeups += woken
        return batch, status, taken

    def decoding(self, entry: Entry) -> bool:
        """Is ``entry``'s outcome still awaited? (A hint, read without the lock.)"""
        return entry in self.dispatch.decoding.entries

    def decoded(self, entry: Entry, outcome: Completed[Any] | Failed) -> None:
        """A decode thread's outcome for ``entry`` (see ``Decoding.give``)."""
        wakeups: list[Wakeup] = []
        with self.lock:
            taken = self.dispatch.decoding.give(entry, outcome, self.clock(), wakeups)
            retried = taken and entry.timed  # back to its timer, for a retry's backoff
        self.deliver(wakeups)
        if retried:
            self.on_new_deadline()

    def worker_died(
        self, worker: WorkerSlot, crash: Callable[[Entry, bool], Failure], exitcode: int | None = None,
        signal: str | None = None, restart: bool = False, last_started: int | None = None,
    ) -> tuple[bool, list[Wakeup]]:  # fmt: skip
        """A worker's death was seen (see ``Dispatch.died``): must the caller
        close its pipe now, and the wake-ups for the caller to run."""
        wakeups: list[Wakeup] = []
        with self.lock:
            close = self.dispatch.died(worker, crash, exitcode, signal, restart, self.clock(), wakeups, last_started)
        return close, wakeups

    def handoffs(self) -> list[tuple[WorkerSlot, Entry]]:
        """Jobs given to idle workers by ``worker_died`` (a dead worker's queue), to send."""
        with self.lock:
            return self.dispatch.take_handoffs()

    def fail_waiting(self, lane: LaneState, failure: Callable[[Entry], Failure]) -> None:
        """Fail every job waiting in ``lane``: its workers cannot start, and no handle may wait forever."""
        wakeups: list[Wakeup] = []
        with self.lock:
            self.dispatch.fail_waiting(lane, failure, self.clock(), wakeups)
        self.deliver(wakeups)

    # --- ending jobs from outside ----------------------------------------------------

    def expired(self, now: float) -> list[WorkerSlot]:
        """Workers whose job ran past its deadline, doomed: the caller kills them."""
        with self.lock:
            return self.stopping.expired(now)

    def memory_limited(self) -> list[tuple[WorkerSlot, Entry]]:
        """Running jobs with a memory limit, with their workers."""
        with self.lock:
            return self.stopping.memory_limited()

    def decide_kill(self, worker: WorkerSlot, entry: Entry, failure: Failure) -> bool:
        """Decide that ``entry`` ends with ``failure``, its worker killed (see ``Stopping.decide_kill``)."""
        with self.lock:
            return self.stopping.decide_kill(worker, entry, failure)

    def cancel(self, key: str) -> tuple[bool, tuple[WorkerSlot, Entry] | None, tuple[WorkerSlot, int] | None]:
        """Cancel the live job of ``key`` (see ``Stopping.cancel``)."""
        wakeups: list[Wakeup] = []
        with self.lock:
            entry = self.keys.live.get(key)
            if entry is not None and self.dispatch.decoding.cancel(entry, self.clock(), wakeups):
                answer: tuple[bool, tuple[WorkerSlot, Entry] | None, tuple[WorkerSlot, int] | None] = (True, None, None)
            else:
                answer = self.stopping.cancel(key, self.clock(), wakeups)
        self.deliver(wakeups)
        return answer

    def spare(self, worker: WorkerSlot, cancelled: Entry) -> tuple[bool, list[Entry]]:
        """Must the kill of ``worker`` for ``cancelled`` go ahead? Else, the
        jobs to send it now (see ``Stopping.spare``)."""
        wakeups: list[Wakeup] = []
        batch: list[Entry] = []
        with self.lock:
            kill = self.stopping.spare(worker, cancelled, self.clock(), batch, wakeups)
        self.deliver(wakeups)
        return kill, batch

    def cancel_all(self, why: str) -> list[WorkerSlot]:
        """Fail every waiting job as cancelled; returns the busy workers, doomed, to kill."""
        wakeups: list[Wakeup] = []
        with self.lock:
            now = self.clock()
            doomed = self.stopping.cancel_all(why, now, wakeups)
            self.dispatch.decoding.end_all(why, now, wakeups)  # (a decode may take as long as it likes)
        self.deliver(wakeups)
        return doomed

    # --- closing ------------------------------------------------------------

    def stop(self) -> None:
        """The supervisor is stopping: no entry may enter a lane any more."""
        with self.lock:
            self.keys.closing = True
            self.keys.stopped = True

    def start_closing(self) -> None:
        with self.lock:
            self.keys.close()

    def break_down(self, cause: BaseException) -> None:
        """The I/O thread died of ``cause``: no more pushes, saying why (``StateMap.claim``)."""
        with self.lock:
            self.keys.close(cause)

    # --- waiting on an entry ----------------------------------------------------

    def settled(self, entry: Held) -> bool:
        """May ``entry``'s outcome be given out? (A store's waits for it to be durable.)"""
        return entry.outcome is not None

    def wait_event(self, entry: Entry) -> threading.Event | None:
        """An event set when ``entry`` is DONE, or None if it already is."""
        with self.lock:
            if entry.outcome is None and entry.event is None:
                entry.event = threading.Event()
            return None if entry.outcome is not None else entry.event

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
            return self.keys.state(key, self.clock())

    def forget(self, key: str) -> bool:
        """Drop an ended key. False if the queue holds no such key; raises
        ``ValueError`` for a live one."""
        with self.lock:
            return self.keys.forget(key, self.clock())

    def snapshot(self, prefix: str | None, kinds: tuple[type, ...] | None) -> list[Entry | Ended]:
        """Every key (with ``prefix``, in a state of ``kinds``), sorted, as its
        live entry or an ``Ended`` stand-in for its record."""
        with self.lock:
            return self.keys.snapshot(prefix, kinds, self.clock())

    def stats(self) -> QueueStats:
        with self.lock:
            return self.keys.stats(self.clock(), self.dispatch.stats())

    def live_count(self) -> int:
        return len(self.keys.live)  # (a dict's length: read without the lock)

    def _check_invariants(self) -> None:
        """Assert the relations between fields that the code relies on (for tests)."""
        with self.lock:
            self.keys.check()
            self.dispatch.check(self.keys.live)
