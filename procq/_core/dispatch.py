"""The lanes: handing jobs to workers, and what a worker's reports and death do.

``Dispatch`` owns the lanes (``_core.entries.LaneState``) and their workers' bookkeeping
(``_core.entries.WorkerSlot``): which worker runs which job, which jobs are sent ahead to a
busy worker and what becomes of them, a lane's room for waiting pushes, and a worker's
start, retirement and death (its ``WorkerLife``). A key's own status changes go through
the state map (``_core.statemap.StateMap``). Everything here runs with ``Core.lock`` held;
like the rest of the core it never touches a pipe or a process: it returns the jobs to
send, and the caller sends them.

Several jobs in flight per worker
---------------------------------
While a lane's jobs are short (``PIPELINE_WINDOW``) and some wait, a busy
worker is sent jobs ahead of the one it runs (``WorkerSlot.queue``), in one
frame; they are still Pending and count against the lane's capacity. A worker
runs them in order and reports each as it ends, so the supervisor always knows
which one runs: the first it has not heard back about. If the worker dies,
that one fails; the others never started and go back to the front of their
lane (``requeue``). A job with a time or memory limit is never sent ahead, nor
behind one, so its limit counts from its real start.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from procq._core import spares as _spares
from procq._core.answers import Offer, Offered, Reported
from procq._core.decoding import Decoding
from procq._core.entries import PENDING, PROCESSING, Entry, LaneState, Wakeup, WorkerLife, WorkerSlot
from procq._core.statemap import StateMap
from procq._model.job import Job, Lane
from procq._model.values import Failed, Failure, LaneStats
from procq._wire.protocol import Report, Undecoded
from procq._wire.startmark import Unstarted

__all__ = ["PIPELINE_DEPTH", "PIPELINE_WINDOW", "UNSTARTED_DEATHS_TO_FAIL", "Dispatch"]


#: A lane whose jobs run for less than this (on average, lately) has jobs sent
#: ahead to its busy workers: enough to keep each busy for about this long.
PIPELINE_WINDOW = 0.005
#: The cores this process may run on (the share of them a running job gets: see ``reports``).
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
#: At most this many jobs in flight to one worker (the running one included).
PIPELINE_DEPTH = 16
#: A job given to this many workers in a row that each died before starting
#: it fails (kind "crashed") rather than go to another: the lane's workers
#: keep dying before any job starts, and it must not bounce for ever. The
#: same number of workers dying in a row while they start fails a lane's
#: waiting jobs (``_supervisor.end``).
UNSTARTED_DEATHS_TO_FAIL = 3

READY, DOOMED, RETIRED, DEAD = WorkerLife.READY, WorkerLife.DOOMED, WorkerLife.RETIRED, WorkerLife.DEAD


class Dispatch:
    """The lanes and their workers (see the module docstring)."""

    __slots__ = ("_handoffs", "decoding", "default_lane", "keys", "lanes")

    def __init__(self, lanes: dict[str, Lane], keys: StateMap) -> None:
        self.lanes = {name: LaneState(name, spec) for name, spec in lanes.items()}
        self.default_lane = next(iter(self.lanes.values()))
        self.keys = keys
        # Jobs given to idle workers while the I/O thread handled a death (see take_handoffs).
        self._handoffs: list[tuple[WorkerSlot, Entry]] = []
        # Jobs whose outcome a decode thread is decoding (see ``reports``).
        self.decoding = Decoding(keys)

    def lane_for(self, job: Job[Any]) -> LaneState:
        if job.lane is None:
            return self.default_lane
        lane = self.lanes.get(job.lane)
        if lane is None:
            known = ", ".join(repr(n) for n in self.lanes)
            raise ValueError(f"job {job.key!r}: unknown lane {job.lane!r}; this queue's lanes are {known}")
        return lane

    # --- entering a lane ----------------------------------------------------------

    def admit(self, entry: Entry, blocked_wakeup: Wakeup | None, clock: Callable[[], float]) -> Offer:
        """A pushed entry enters its lane: to an idle worker (returned: the
        caller sends it), into ready, or, when the lane is full, nowhere
        (``FULL``) or, given ``blocked_wakeup``, into ``blocked``."""
        lane = entry.lane
        if lane.idle:
            worker = lane.idle.pop()
            self._assign(worker, entry, clock())
            return worker
        if not lane.blocked and len(lane.ready) + lane.prefetched < lane.spec.capacity:
            # (Never past a blocked push: pushes enter in arrival order.)
            lane.ready.append(entry)
            return Offered.QUEUED
        if blocked_wakeup is None:
            return Offered.FULL
        lane.blocked.append((entry, blocked_wakeup))
        return Offered.BLOCKED

    def enter_lane(self, entry: Entry, now: float) -> WorkerSlot | None:
        """A claimed entry whose time has come goes to its lane: to an idle
        worker (returned: the caller sends it), into ready, or into overdue
        when ready is full."""
        lane = entry.lane
        entry.since = now  # (its wait for a worker starts now: see _metrics)
        if lane.idle:
            worker = lane.idle.pop()
            self._assign(worker, entry, now)
            return worker
        if len(lane.ready) + lane.prefetched < lane.spec.capacity:
            lane.ready.append(entry)
        else:
            lane.overdue.append(entry)
        return None

    def unblock(self, entry: Entry) -> bool:
        """Take ``entry`` out of its lane's blocked pushes; False if it is not there."""
        blocked = entry.lane.blocked
        for i, (e, _) in enumerate(blocked):
            if e is entry:
                del blocked[i]
                return True
        return False

    def _assign(self, worker: WorkerSlot, entry: Entry, now: float) -> None:
        """Start ``entry`` on ``worker``, and hold the right to send it: the caller sends it."""
        self.keys.start(entry, worker, now)
        worker.sending += 1

    def _next_job(self, worker: WorkerSlot, now: float, wakeups: list[Wakeup]) -> Entry | None:
        """Give a free worker its next job, or park it idle."""
        lane = worker.lane
        if worker.life is not READY:
            return None
        if lane.ready:
            entry = lane.ready.popleft()
        elif lane.overdue:  # only with capacity 0
            entry = lane.overdue.popleft()
        elif lane.blocked:  # only with capacity 0: hand over directly
            entry, wakeup = lane.blocked.popleft()
            wakeups.append(wakeup)
        elif worker.jobs == 0:
            # A new worker goes to the back of the idle list (idle.pop() takes the end): warmest first.
            lane.idle.insert(0, worker)
            return None
        else:
            lane.idle.append(worker)
            return None
        self.refill(lane, wakeups)
        self._assign(worker, entry, now)
        return entry

    def refill(self, lane: LaneState, wakeups: list[Wakeup]) -> None:
        """Move overdue jobs, then blocked pushes, into ready while the lane
        has room.

        Blocked pushes are let in only once the lane has drained to its low
        mark (``low_mark``), then as many as fit: a thread pushing into a
        full lane then sleeps once per many jobs, not once per job (each
        sleep is an Event and a thread switch, most of a tiny job's cost)."""
        capacity = lane.spec.capacity - lane.prefetched
        while lane.overdue and len(lane.ready) < capacity:
            lane.ready.append(lane.overdue.popleft())
        if not lane.blocked or len(lane.ready) + lane.prefetched > low_mark(lane.spec.capacity):
            return
        while lane.blocked and len(lane.ready) < capacity:
            entry, wakeup = lane.blocked.popleft()
            lane.ready.append(entry)
            wakeups.append(wakeup)

    def feed(self, worker: WorkerSlot, batch: list[Entry], now: float, wakeups: list[Wakeup]) -> None:
        """Put in ``batch`` the jobs a worker that can take work is to be sent
        now, in one frame, and hold the right to send them: jobs ahead of the
        one it runs, or, idle, its next job and those ahead of it (or park it
        idle). Then let blocked pushes into the room made."""
        if worker.entry is not None:
            self._top_up(worker, batch)
            if batch:
                worker.sending += 1
        else:
            first = self._next_job(worker, now, wakeups)  # (holds the right to send)
            if first is not None:
                batch.append(first)
                self._top_up(worker, batch)
        self.refill(worker.lane, wakeups)

    def _top_up(self, worker: WorkerSlot, batch: list[Entry]) -> None:
        """Send short jobs ahead to a busy worker: while its lane's jobs run
        for less than ``PIPELINE_WINDOW`` on average, keep up to
        ``PIPELINE_DEPTH`` jobs in flight to it, so it goes from one to the
        next without waiting for the supervisor. Never for untrusted or
        remote lanes, and never a job with a time or memory limit, or behind
        one: those start only on a worker with nothing queued, so their
        limits count from their real start."""
        lane = worker.lane
        spec = lane.spec
        running = worker.entry
        if (
            lane.service is None
            or running is None
            or not spec.trusted
            or spec.remote
            or worker.life is not READY
            or worker.retire_requested
            or running.deadline is not None
            or running.memory_limit is not None
        ):
            return
        depth = min(PIPELINE_DEPTH - 1, int(PIPELINE_WINDOW / max(lane.service, 1e-6)))
        if len(worker.queue) > depth // 2:
            return  # topped up when half run: one frame for several jobs
        room = depth - len(worker.queue)
        if spec.max_jobs_per_worker is not None:
            room = min(room, spec.max_jobs_per_worker - worker.jobs - len(worker.queue))
        ready = lane.ready
        while room > 0 and ready:
            entry = ready[0]
            if entry.timeout is not None or spec.timeout is not None or entry.memory_limit is not None:
                break
            ready.popleft()
            entry.worker = worker
            worker.queue.append(entry)
            lane.prefetched += 1
            batch.append(entry)
            room -= 1

    # --- a worker's reports -----------------------------------------------------------

    def reports(
        self,
        worker: WorkerSlot,
        reports: list[Report],
        now: float,
        wakeups: list[Wakeup],
        undecoded: list[tuple[Entry, Undecoded]],
    ) -> tuple[list[Entry], Reported, int]:
        """Settle a worker's reports, in the order it ran them:
        a ``Report`` each (``retire``: the worker
        must be replaced after it; ``crashed``: count it as a crash). The
        worker's next job is the first of its queue, if it has one: it has
        already started it. A job whose outcome is ``Undecoded`` leaves its
        worker all the same, but is held in ``decoding`` (still PROCESSING)
        and put in ``undecoded`` for the caller to hand to a decode thread.

        Returns the jobs the caller must now send to the same worker (in one
        frame; empty: none; the caller holds one right to send for them), what
        the reports came to (``Reported``: ``RETIRE`` when a report asked for
        it, or the worker has run its lane's ``max_jobs_per_worker``;
        ``UNEXPECTED`` when a report was not for the job it holds, and the
        reports from that one on changed nothing), and how many were taken."""
        batch: list[Entry] = []
        status = Reported.DONE
        taken = 0
        lane = worker.lane
        keys = self.keys
        for job_id, outcome, retire, crashed in reports:
            entry = worker.entry
            if entry is None or entry.job_id != job_id:
                status = Reported.UNEXPECTED
                break
            taken += 1
            # Its run at the share of a core it had: with more jobs running
            # than cores, short jobs read in wall time would look long, and
            # stop being sent ahead when the supervisor's turns are scarcest.
            ran = (now - worker.started) * min(1.0, _CPUS / max(1, keys.processing))
            lane.service = ran if lane.service is None else 0.8 * lane.service + 0.2 * ran
            worker.entry = None
            if entry.kill_reason is not None:
                # Its end was decided (cancel, timeout, memory) before this
                # report arrived: it ends as decided, exactly once.
                outcome = Failed(entry.kill_reason)
            elif crashed:
                if type(outcome) is Unstarted:  # its process died before it started: not its failure
                    keys.unstart(entry, now)
                    if entry.unstarted < UNSTARTED_DEATHS_TO_FAIL:
                        lane.ready.appendleft(entry)  # (this worker takes it next: see feed)
                        continue
                    wakeups += keys.settle(entry, Failed(outcome.failure), now)
                    continue
                lane.crashes += 1
            if retire and type(outcome) is Failed:  # (its job's failure retires it: the metrics' cause)
                worker.retire_cause = outcome.failure.kind
            if isinstance(outcome, Undecoded):
                self.decoding.hold(entry)
                undecoded.append((entry, outcome))
            else:
                wakeups += keys.finish(entry, outcome, now)
            if worker.queue:
                if retire:
                    worker.retire_requested = True  # once its queue has run
                nxt = worker.queue.popleft()
                lane.prefetched -= 1
                keys.start(nxt, worker, now)
                continue
            limit = lane.spec.max_jobs_per_worker
            retire = retire or worker.retire_requested or (limit is not None and worker.jobs >= limit)
            if retire and worker.life is READY:
                self._retire(worker, now, wakeups)
                status = Reported.RETIRE
                break
        if status is Reported.DONE:
            self.feed(worker, batch, now, wakeups)
        return batch, status, taken

    def _retire(self, worker: WorkerSlot, now: float, wakeups: list[Wakeup]) -> None:
        """Take an idle worker out of its lane and replace it (``replace``).
        The caller closes its pipe; it exits on EOF."""
        worker.life = RETIRED
        worker.lane.workers.remove(worker)
        self.replace(worker.lane, now, wakeups)

    # --- a worker's start and death -------------------------------------------------------

    def replace(self, lane: LaneState, now: float, wakeups: list[Wakeup]) -> None:
        """A worker of ``lane`` is to be replaced: by a spare at once if
        there is one (a READY one takes a waiting job: see ``take_handoffs``),
        else by a process to start, reserved here (``starting``)."""
        lane.restarts += 1
        spare = _spares.take(lane)
        if spare is None:
            lane.starting += 1
        elif spare.life is READY:
            entry = self._next_job(spare, now, wakeups)
            if entry is not None:
                self._handoffs.append((spare, entry))

    def add_worker(self, worker: WorkerSlot | None, lane: LaneState, reserved: bool) -> bool:
        """A new worker process joined ``lane`` (``None``: starting it
        failed). ``reserved``: started after the lane's first workers, it
        fills a reserved place or is a spare (``_core.spares.arrive``). True: a spare."""
        lane.tally.starts += worker is not None
        if worker is not None and reserved:
            return _spares.arrive(worker, lane)
        if worker is not None:
            lane.workers.append(worker)
        elif reserved:
            lane.starting -= 1
            lane.restarts -= 1
        return False

    def ready(self, worker: WorkerSlot, now: float, wakeups: list[Wakeup]) -> Entry | None:
        """A worker finished starting. Returns a job to send it, if one waits."""
        if worker.life is WorkerLife.BOOTING:
            worker.life = READY
        elif worker.life is WorkerLife.DOOMED_BOOTING:
            worker.life = DOOMED  # (it was doomed meanwhile: it gets no job)
        worker.lane.boot_failures = 0
        return None if worker.spare else self._next_job(worker, now, wakeups)

    def died(
        self,
        worker: WorkerSlot,
        crash: Callable[[Entry, bool], Failure],
        exitcode: int | None,
        signal: str | None,
        restart: bool,
        now: float,
        wakeups: list[Wakeup],
        last_started: int | None = None,
    ) -> bool:
        """A worker's death was seen. Its job (if any) fails with
        ``crash(entry, True)``, or with the ``kill_reason`` the supervisor gave it
        before killing it (completed with how the worker died); the jobs sent
        ahead to it go back to their lane (``requeue``). A job it was given
        but had not started (``last_started``, the id of the last job the
        worker started, is not its id; None: unknown, so started) was not
        the cause: it goes back to the front of its lane too, unless workers
        died before starting it ``UNSTARTED_DEATHS_TO_FAIL`` times
        (``crash(entry, False)``). With ``restart``, it
        is replaced (``replace``) in the same step, so that a woken waiter
        finds the lane whole again. A crash turns the lane's spares on
        (``_core.spares``). Returns whether the caller must close its pipe now (no
        sender holds it)."""
        life = worker.life
        if life is DEAD:
            return False
        worker.life = DEAD
        lane = worker.lane
        if worker in lane.idle:
            lane.idle.remove(worker)
        if worker.spare:
            lane.spares.remove(worker)
        elif life is not RETIRED:
            lane.workers.remove(worker)
        entry = worker.entry
        worker.entry = None
        unstarted: Entry | None = None
        if entry is not None and entry.kill_reason is None and last_started not in (None, entry.job_id):
            unstarted, entry = entry, None
            self.keys.unstart(unstarted, now)
            if unstarted.unstarted < UNSTARTED_DEATHS_TO_FAIL:
                unstarted.worker = worker  # (requeue takes it from the worker's queue, first)
                worker.queue.appendleft(unstarted)
                lane.prefetched += 1
            else:
                wakeups += self.keys.settle(unstarted, Failed(crash(unstarted, False)), now)
        self.requeue(worker, now, wakeups)
        if life.booting:
            lane.boot_failures += 1
        if restart:
            self.replace(lane, now, wakeups)
        kind = None
        if entry is not None:
            failure = entry.kill_reason
            if failure is None:
                failure = crash(entry, True)
                lane.crashes += 1
                lane.spares_on = lane.spec.spares > 0
            else:
                failure = replace(failure, exitcode=exitcode, signal=signal)
            kind = failure.kind
            wakeups += self.keys.finish(entry, Failed(failure), now)
        retired = (worker.retire_cause or "recycled") if life is RETIRED else None
        stopping = self.keys.stopped or self.keys.cancelled
        lane.tally.died(retired, life.booting, kind, signal, stopping)
        if retired is None and not life.booting and kind is None and not stopping:
            # A worker event among the queue's last failures (``procq top``), not a job's.
            how = f"was killed by {signal}" if signal else f"exited with code {exitcode}"
            held = "while idle" if unstarted is None else f"before it started job {unstarted.key!r}"
            if unstarted is not None and unstarted.outcome is None:
                held += " (not the job's fault: it goes to another worker)"
            message = f"worker process {worker.pid} {how} {held}"
            self.keys.failures.append((time.time(), "", lane.name, "worker", message))
        return worker.sending == 0

    def requeue(self, worker: WorkerSlot, now: float, wakeups: list[Wakeup]) -> None:
        """A dead worker's queued jobs never started: back to the front of
        their lane, in order (a cancelled one just ends), and to an idle
        worker if there is one (see ``take_handoffs``)."""
        if not worker.queue:
            return
        lane = worker.lane
        queued = list(worker.queue)
        worker.queue.clear()
        lane.prefetched -= len(queued)
        for entry in reversed(queued):
            entry.worker = None
            if entry.kill_reason is not None:
                wakeups += self.keys.settle(entry, Failed(entry.kill_reason), now)
            else:
                lane.ready.appendleft(entry)
        while lane.idle and lane.ready:
            idle = lane.idle.pop()
            first = lane.ready.popleft()
            self._assign(idle, first, now)
            self._handoffs.append((idle, first))

    def take_handoffs(self) -> list[tuple[WorkerSlot, Entry]]:
        """Jobs given to idle workers by ``died`` (a dead worker's queue): the I/O thread sends them."""
        sends, self._handoffs = self._handoffs, []
        return sends

    def fail_waiting(
        self, lane: LaneState, failure: Callable[[Entry], Failure], now: float, wakeups: list[Wakeup]
    ) -> None:
        """Fail every job waiting in ``lane`` (its workers cannot start)."""
        waiting = [*lane.ready, *lane.overdue]
        lane.ready.clear()
        lane.overdue.clear()
        for entry in waiting:
            wakeups += self.keys.settle(entry, Failed(failure(entry)), now)
        self.refill(lane, wakeups)

    def stats(self) -> dict[str, LaneStats]:
        return {name: lane.stats() for name, lane in self.lanes.items()}

    def check(self, live: dict[str, Entry]) -> None:
        """Assert the lanes' invariants (for ``Core._check_invariants``)."""
        for lane in self.lanes.values():
            assert len(lane.ready) + lane.prefetched <= lane.spec.capacity
            assert not lane.blocked or len(lane.ready) + lane.prefetched > low_mark(lane.spec.capacity)
            assert not lane.overdue or len(lane.ready) + lane.prefetched == lane.spec.capacity
            assert lane.prefetched == sum(len(w.queue) for w in lane.workers)
            for w in lane.workers:
                assert w.life is not RETIRED and w.life is not DEAD, w.life
                assert not w.queue or w.entry is not None
                for e in w.queue:
                    assert e.status is PENDING and e.worker is w and live.get(e.key) is e
            assert not lane.idle or not (lane.ready or lane.overdue), lane.name
            assert len(lane.workers) + lane.starting <= lane.spec.workers
            _spares.check(lane)
            busy = [w for w in lane.workers if w.entry is not None]
            assert len(busy) + self.decoding.check(lane, live) == lane.running
            for w in lane.idle:
                assert w.entry is None and w in lane.workers
            for w in busy:
                assert w.life is READY or w.life is DOOMED, w.life
                assert w.entry is not None and w.entry.status is PROCESSING
                assert live.get(w.entry.key) is w.entry
            for e in (*lane.ready, *lane.overdue):
                assert e.status is PENDING and not e.timed and live.get(e.key) is e


def low_mark(capacity: int) -> int:
    """How far a full lane drains before its blocked pushes are let in: a quarter of a large lane; a small one, 1."""
    return capacity - capacity // 4 if capacity >= 16 else capacity - 1
