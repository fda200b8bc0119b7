"""Several jobs in flight per worker (Dispatch._top_up), driven on the I/O-free core
directly: the orders of events that a real queue only meets by chance.

The core never touches a process or a pipe, so a worker here is a WorkerSlot
with no channel, and "the worker reports" is a call to ``Core.jobs_done``.
"""

from __future__ import annotations

from typing import Any

import jobs

from procq import Completed, Failed, Failure, Job, Lane, Pending, Processing
from procq._core.core import Core
from procq._core.entries import Entry, LaneState, WorkerLife, WorkerSlot


class _Channel:
    pid = None


def _core_with_worker(capacity: int = 100, **lane: Any) -> tuple[Core, LaneState, WorkerSlot]:
    core = Core({"l": Lane(workers=1, capacity=capacity, **lane)}, check_payload=False, strict_payload=False)
    lane = core.lanes["l"]
    worker = WorkerSlot(lane, _Channel())
    core.add_worker(worker, lane, reserved=False)
    assert core.worker_ready(worker) is None  # nothing waits yet: it goes idle
    lane.service = 1e-5  # this lane's jobs are short: jobs are sent ahead
    return core, lane, worker


def _push(core: Core, lane: LaneState, key: str) -> tuple[Entry, Any]:
    kind, entry, _ = core.claim(Job(key, jobs.getpid), lane)
    assert kind == "queued"
    return entry, core.offer(entry)


def _done(core: Core, worker: WorkerSlot, entry: Entry, output: Any) -> tuple[list[Entry], str]:
    batch, status, taken = core.jobs_done(worker, [(entry.job_id, Completed(output), False, False)])
    assert taken == 1
    if batch:
        core.sent(worker)  # (the caller would send them, then give back its right to send)
    return batch, status


def test_jobs_are_sent_ahead_to_a_busy_worker_and_start_in_order() -> None:
    core, lane, worker = _core_with_worker()
    first, offered = _push(core, lane, "a")
    assert offered is worker  # the idle worker took it: the pusher sends it
    core.sent(worker)
    rest = [_push(core, lane, k)[0] for k in "bcd"]
    batch, status = _done(core, worker, first, 1)  # a ends: b starts, c and d go ahead
    assert status == "done" and batch == rest
    assert [core.state(k) for k in "abcd"] == [Completed(1), Processing(), Pending(), Pending()]
    assert lane.prefetched == 2 and list(worker.queue) == rest[1:]
    core._check_invariants()
    for entry, out in zip(rest, (2, 3, 4), strict=True):
        assert _done(core, worker, entry, out) == ([], "done")
    assert [core.state(k) for k in "abcd"] == [Completed(1), Completed(2), Completed(3), Completed(4)]
    assert lane.prefetched == 0 and lane.idle == [worker]
    core._check_invariants()


def test_a_dead_workers_jobs_sent_ahead_go_back_to_the_front_of_their_lane() -> None:
    core, lane, worker = _core_with_worker()
    first, _ = _push(core, lane, "a")
    core.sent(worker)
    _b, c, d = (_push(core, lane, k)[0] for k in "bcd")
    _done(core, worker, first, 1)  # b runs; c and d are in the worker's queue
    e, _ = _push(core, lane, "e")  # waits in the lane, behind them
    _, wakeups = core.worker_died(worker, lambda entry, _: Failure("crashed", f"job {entry.key!r}: its worker died"))
    for wake in wakeups:
        wake()
    state = core.state("b")
    assert isinstance(state, Failed) and state.failure.kind == "crashed"  # only the job it ran
    assert [core.state(k) for k in "cde"] == [Pending(), Pending(), Pending()]
    assert list(lane.ready) == [c, d, e] and lane.prefetched == 0
    core._check_invariants()


def test_a_worker_that_finished_the_job_cancel_meant_to_kill_is_spared() -> None:
    """q.cancel(a) while a runs dooms its worker; the worker's report of a comes
    first, and it starts b, sent ahead. Killing it now would fail b for a's
    cancel: the worker is spared and keeps working."""
    core, lane, worker = _core_with_worker()
    first, _ = _push(core, lane, "a")
    core.sent(worker)
    b, c = (_push(core, lane, k)[0] for k in "bc")
    batch, _ = _done(core, worker, first, 1)  # a ends; b runs, c sent ahead
    assert batch == [b, c]
    cancelled, kill, skip = core.cancel("b")
    assert cancelled and kill == (worker, b) and skip is None and worker.life is WorkerLife.DOOMED
    # The report of b arrives before the I/O thread acts on the cancel: b ends
    # cancelled all the same (its end was decided), and c starts.
    assert _done(core, worker, b, 2) == ([], "done")
    assert core.state("b") == Failed(b.kill_reason)  # type: ignore[arg-type]
    assert core.state("c") == Processing()
    assert core.spare(worker, b) == (False, [])  # c must not die for b's cancel
    assert worker.life is WorkerLife.READY
    assert _done(core, worker, c, 3) == ([], "done") and core.state("c") == Completed(3)
    core._check_invariants()


def test_a_worker_still_running_the_cancelled_job_is_not_spared() -> None:
    core, lane, worker = _core_with_worker()
    first, _ = _push(core, lane, "a")
    core.sent(worker)
    cancelled, kill, _ = core.cancel("a")
    assert cancelled and kill == (worker, first)
    assert core.spare(worker, first) == (True, [])
    assert worker.life is WorkerLife.DOOMED


def test_a_late_sender_leaves_a_retired_workers_pipe_to_the_supervisor_until_it_is_unwatched() -> None:
    """A worker runs the job a pusher sent it and is retired before that
    pusher gives back its right to send. The pipe is still in the supervisor's
    selector: the pusher must not close it (a closed descriptor cannot be
    taken out of it, and its number may be reused). Once the supervisor has
    taken it out, the last one holding a right closes it."""
    core, lane, worker = _core_with_worker(max_jobs_per_worker=1)
    first, offered = _push(core, lane, "a")
    assert offered is worker  # the pusher holds a right to send on its pipe
    _batch, status, _taken = core.jobs_done(worker, [(first.job_id, Completed(1), False, False)])
    assert status == "retire" and worker.life is WorkerLife.RETIRED
    assert core.sent(worker) is False  # the pusher, late: still watched, so not its to close
    worker.sending += 1  # another late sender
    with core.lock:  # what the supervisor does once it has unwatched the pipe
        worker.unwatched = True
        assert worker.sending == 1  # someone still sends: not the supervisor's to close
    assert core.sent(worker) is True  # the last sender closes it


def test_a_jobs_run_is_read_as_the_cores_would_give_it_alone(monkeypatch: Any) -> None:
    """With more jobs running than cores, each takes longer in wall time; the
    lane's estimate of its jobs' service time counts their share of a core,
    so short jobs on an oversubscribed machine are still sent ahead."""
    import time

    from procq._core import dispatch

    monkeypatch.setattr(dispatch, "_CPUS", 1)
    core = Core({"l": Lane(workers=4)}, check_payload=False, strict_payload=False)
    lane = core.lanes["l"]
    workers = [WorkerSlot(lane, _Channel()) for _ in range(4)]
    for worker in workers:
        core.add_worker(worker, lane, reserved=False)
        assert core.worker_ready(worker) is None
    entries = []
    for key in "abcd":
        entry, offered = _push(core, lane, key)
        assert offered is not None
        core.sent(offered)
        entries.append(entry)
    assert core.keys.processing == 4
    first = entries[0].worker
    assert first is not None
    first.started = time.monotonic() - 0.008  # (8 ms in wall time, four jobs sharing one core)
    _done(core, first, entries[0], 1)
    assert lane.service is not None and 0.0015 < lane.service < 0.003, lane.service  # its quarter of 8 ms
