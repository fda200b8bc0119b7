"""Warm spare workers: booted processes a lane keeps beside its workers, so
that a worker that dies or retires is replaced at once, not after a boot.

Why: a new worker takes milliseconds from its start to its READY (a fork of
the lane's template or of the forkserver, then the child's own setting up),
and more on a busy machine. A lane whose jobs crash often would spend much of
its time short of workers, one boot per crash. With spares, a crash promotes
one (a READY spare takes a waiting job in the same step) and the spare that
replaces it boots in the background, off the critical path.

Why not always: a spare is a whole interpreter (10 MiB and more) that runs
nothing. A lane keeps ``Lane.spare_workers`` of them only from its first
crash on (``LaneState.spares_on``, set where ``Dispatch.died`` counts the
crash); a lane whose jobs never crash never has one. Retiring workers
(``max_jobs_per_worker``) do not turn spares on, but a retired worker is
replaced by a spare when there is one.

The bookkeeping, under ``Core.lock`` (called by ``Dispatch``):

- a spare is in ``lane.spares`` with ``WorkerSlot.spare`` set, BOOTING or
  READY (or doomed, while it dies or the queue stops); never in
  ``lane.workers`` or ``lane.idle``, never holding or sent a job, so it never
  counts towards the lane's ``workers``;
- ``take``: the spare that replaces a worker, now one of ``lane.workers``;
- ``arrive``: a process the I/O thread started (``_supervisor.start``) fills
  the place of a reserved replacement first (``lane.starting``), else it is
  a spare: processes of a lane are all alike, so whichever start ends first
  serves whatever the lane needs first;
- ``wanted``: how many processes the lane wants started, for the I/O thread
  (which subtracts the starts it has in flight; it asks for no more, so a
  lane never has more than ``spec.spares`` spares): spares boot one at a time.
"""

from __future__ import annotations

from procq._core.entries import LaneState, WorkerLife, WorkerSlot

__all__ = ["arrive", "check", "take", "wanted"]

READY, BOOTING = WorkerLife.READY, WorkerLife.BOOTING


def take(lane: LaneState) -> WorkerSlot | None:
    """Promote a spare to a worker of ``lane``: a READY one if there is one
    (it can take a job at once), else one still booting (it is further on
    than a process not started yet). None: no spare to promote."""
    chosen = None
    for spare in lane.spares:
        if spare.life is READY:
            chosen = spare
            break
        if chosen is None and spare.life is BOOTING:
            chosen = spare
    if chosen is not None:
        lane.spares.remove(chosen)
        chosen.spare = False
        lane.workers.append(chosen)
    return chosen


def arrive(worker: WorkerSlot, lane: LaneState) -> bool:
    """A process started for ``lane`` as a replacement or a spare: it takes
    a reserved replacement's place if one waits, else it is a spare. True: a spare."""
    if lane.starting:
        lane.starting -= 1
        lane.workers.append(worker)
        return False
    worker.spare = True
    lane.spares.append(worker)
    return True


def wanted(lane: LaneState, spares: bool) -> int:
    """How many processes ``lane`` wants started: its reserved replacements
    and, with ``spares``, one spare if it lacks any and none is booting.

    One spare boots at a time: a boot is mostly CPU, so boots side by side
    only slow each other down (and the jobs running meanwhile), while one
    alone is ready soonest. The next is asked for when it says READY
    (``Supervisor._on_ready``). None after a process of the lane died while
    booting, until one boots again: a lane whose processes cannot start must
    not spin starting spares."""
    n = lane.starting
    if spares and lane.spares_on and not lane.boot_failures and len(lane.spares) < lane.spec.spares:
        n += not any(spare.life is BOOTING for spare in lane.spares)
    return n


def check(lane: LaneState) -> None:
    """Assert the spares' invariants (for ``Dispatch.check``)."""
    assert lane.spares_on or not lane.spares
    for w in lane.spares:
        assert w.spare and w.entry is None and not w.queue and w.sending == 0, w.life
        assert w.life is not WorkerLife.RETIRED and w.life is not WorkerLife.DEAD, w.life
        assert w not in lane.workers and w not in lane.idle
    for w in lane.workers:
        assert not w.spare
