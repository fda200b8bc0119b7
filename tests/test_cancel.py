"""q.cancel(): a waiting job never runs (and a push blocked for room gets its place), a running
one is killed and its worker replaced, a push still pickling or blocked is cancelled, a job sent
ahead to a busy worker is skipped, and every waiter (threads and tasks) wakes to one failure."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import jobs
import jobs_control
import jobs_core
import jobs_crashes
import pytest
from core_support import WAIT, BlockingCall, Gates, OnPickle, failure_of, hold, open_queue, wait_started
from process_support import children, linux_only

from procq import Completed, Failed, InFlight, Job, JobFailed, Lane, Pending, Processing, Queued

pytestmark = pytest.mark.skipif(not linux_only, reason="job control relies on Linux process groups and /proc")


def test_cancel_a_pending_job_it_never_runs_and_a_blocked_push_gets_its_room(tmp_path: Any, gates: Gates) -> None:
    marker = tmp_path / "ran"
    with open_queue({"t": Lane(workers=1, capacity=1)}) as q:
        held, _, go = hold(q, gates, "held")
        waiting = q.push(Job("waiting", jobs_control.touch_then, args=(str(marker),)))
        assert isinstance(waiting, Queued)
        blocked = BlockingCall(lambda: q.push(Job("blocked", jobs.square, args=(3,))))
        blocked.wait_blocked()

        assert q.cancel("waiting") is True
        failure = failure_of(waiting.handle, "cancelled")
        assert failure.message == "job 'waiting' was cancelled by q.cancel()"
        assert q.state("waiting") == Failed(failure)
        # Its room went to the blocked push.
        accepted = blocked.outcome()
        assert isinstance(accepted, Queued)
        assert q.stats().lanes["t"].waiting == 1
        assert q.cancel("waiting") is False

        go.open()
        held.result(timeout=WAIT)
        assert accepted.handle.result(timeout=WAIT) == 9  # ran after where "waiting" stood
        assert not marker.exists()
        stats = q.stats()
        assert (stats.completed, stats.failed, stats.pending, stats.processing) == (2, 1, 0, 0)
        assert stats.lanes["t"].worker_restarts == 0  # no worker was touched

        # A cancelled key is pushed again like any failed key, and runs fresh.
        again = q.push(Job("waiting", jobs_control.touch_then, args=(str(marker), "fresh")))
        assert isinstance(again, Queued)
        assert again.handle.result(timeout=WAIT) == "fresh" and marker.exists()
        assert q.state("waiting") == Completed("fresh")


@pytest.mark.parametrize("capacity", [0, 1])
def test_cancel_a_blocked_push(tmp_path: Any, capacity: int, gates: Gates) -> None:
    """A push waiting for room (no capacity, or a full lane) is cancelled: it
    returns Queued with a handle that says cancelled, and the job never runs."""
    marker = tmp_path / "ran"
    with open_queue({"t": Lane(workers=1, capacity=capacity)}) as q:
        held, _, go = hold(q, gates, "held")
        if capacity:
            assert isinstance(q.push(Job("filler", jobs.square, args=(2,))), Queued)
        call = BlockingCall(lambda: q.push(Job("blocked", jobs_control.touch_then, args=(str(marker),))))
        call.wait_blocked()
        assert q.state("blocked") == Pending()
        assert q.cancel("blocked") is True
        outcome = call.outcome()
        assert isinstance(outcome, Queued)
        failure = failure_of(outcome.handle, "cancelled")
        assert failure.message == "job 'blocked' was cancelled by q.cancel()"
        assert q.stats().lanes["t"].waiting == capacity
        go.open()
        held.result(timeout=WAIT)
        assert q.push_and_wait(Job("after", jobs.square, args=(4,)), timeout=WAIT) == 16
        assert not marker.exists()


def test_cancel_while_the_push_is_still_pickling(tmp_path: Any) -> None:
    """A cancel between a push's claim and its offer to the lane: the push
    returns Queued, the handle says cancelled, the job never runs."""
    marker = tmp_path / "ran"
    with open_queue(1) as q:
        said: list[bool] = []
        arg = OnPickle(lambda: said.append(q.cancel("early")), value=str(marker))
        outcome = q.push(Job("early", jobs_control.touch_then, args=(arg,)))
        assert said == [True] and isinstance(outcome, Queued)
        failure_of(outcome.handle, "cancelled")
        assert q.push_and_wait(Job("after", jobs.square, args=(3,)), timeout=WAIT) == 9
        assert not marker.exists()


def test_cancel_a_running_job_kills_it_and_replaces_its_worker(start_method: str, tmp_path: Any, gates: Gates) -> None:
    with open_queue({"t": 2}, start_method=start_method) as q:
        other, other_pid, other_go = hold(q, gates, "other")
        handle, pid, _ = hold(q, gates, "victim")
        assert q.cancel("victim") is True
        assert q.cancel("victim") is False  # being ended already
        failure = failure_of(handle, "cancelled")
        assert failure.pid == pid and failure.signal == "SIGTERM"
        assert pid not in q._worker_pids() and pid not in children()
        lane = q.stats().lanes["t"]
        assert (lane.crashes, lane.worker_restarts, lane.failed, lane.workers_alive) == (0, 1, 1, 2)
        assert q.cancel("victim") is False
        assert q.state("other") == Processing()
        other_go.open()
        assert other.result(timeout=WAIT) == other_pid
        # And pushed again it runs, on the replacement or the other worker.
        assert q.push_and_wait(Job("victim", jobs.getpid), timeout=WAIT) != pid


def test_cancel_a_finished_or_unknown_key_changes_nothing() -> None:
    with open_queue(1) as q:
        assert q.cancel("never-pushed") is False
        assert q.push_and_wait(Job("done", jobs.square, args=(3,)), timeout=WAIT) == 9
        with pytest.raises(JobFailed):
            q.push_and_wait(Job("failed", jobs.boom), timeout=WAIT)
        stats = q.stats()
        failed = q.state("failed")
        assert q.cancel("done") is False and q.cancel("failed") is False
        assert q.state("done") == Completed(9) and q.state("failed") == failed
        assert q.stats() == stats
        with pytest.raises(TypeError, match=r"^a key is a str, got int: 1$"):
            q.cancel(1)  # type: ignore[arg-type]


def test_cancel_a_job_sent_ahead_to_a_busy_worker_it_never_runs(
    tmp_path: Any, gates: Gates, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lane of short jobs sends jobs ahead to a busy worker (Dispatch._top_up).
    One cancelled there is skipped by the worker: it never runs."""
    import procq._core.dispatch

    monkeypatch.setattr(procq._core.dispatch, "PIPELINE_WINDOW", 60.0)  # every job counts as short
    log = str(tmp_path / "log")
    first, second = gates("first"), gates("second")
    with open_queue({"one": Lane(workers=1)}) as q:
        core_lane = q._core.lanes["one"]
        assert q.push_and_wait(Job("warm", jobs.getpid, lane="one"), timeout=WAIT) > 0
        a = q.push(Job("a", jobs.signal_and_wait, args=(first.started, first.go), lane="one")).handle
        first.wait_started()
        b = q.push(Job("b", jobs.signal_and_wait, args=(second.started, second.go), lane="one")).handle
        c = q.push(Job("c", jobs_core.record, args=(log, "c"), lane="one")).handle
        d = q.push(Job("d", jobs_core.record, args=(log, "d"), lane="one")).handle
        first.open()  # a ends; the worker is given b, and c and d behind it
        second.wait_started()
        assert a.result(timeout=WAIT) > 0
        assert core_lane.prefetched == 2 and q.state("c") == Pending()
        assert q.cancel("c") is True
        assert q.cancel("c") is False  # its end is decided already
        second.open()
        assert b.result(timeout=WAIT) > 0 and d.result(timeout=WAIT) > 0
        failure = failure_of(c, "cancelled")
        assert failure.message == "job 'c' was cancelled by q.cancel()"
        with open(log) as f:
            assert [line.split()[0] for line in f] == ["d"]  # c never ran
        assert q.push_and_wait(Job("c", jobs_core.record, args=(log, "c again"), lane="one"), timeout=WAIT) > 0


def test_cancel_racing_completion_ends_once(tmp_path: Any) -> None:
    """Cancel a job as it starts or just as it finishes: whichever wins, the
    job ends in one terminal state, the one cancel's answer says."""
    with open_queue(1) as q:
        outcomes = []
        for i in range(30):
            key = f"race-{i}"
            if i % 2:  # cancel as it is about to return: the cancel races its result
                started = jobs.fifo(tmp_path, f"started-{i}")
                handle = q.push(Job(key, jobs_crashes.report_pid_then, args=(started, jobs.square, i))).handle
                wait_started(handle, started)
            else:  # cancel at once: it may be waiting, starting or done
                handle = q.push(Job(key, jobs.square, args=(i,))).handle
            cancelled = q.cancel(key)
            try:
                output = handle.result(timeout=WAIT)
            except JobFailed as exc:
                assert cancelled, exc
                assert exc.failure.kind == "cancelled" and q.state(key) == Failed(exc.failure)
                outcomes.append("cancelled")
            else:
                assert not cancelled and output == i * i
                assert q.state(key) == Completed(output)
                outcomes.append("completed")
            assert q.cancel(key) is False
            assert handle.state == q.state(key)
        stats = q.stats()
        assert stats.failed == outcomes.count("cancelled") and stats.pending == stats.processing == 0


@pytest.mark.parametrize("where", ["pending", "running"])
def test_cancel_wakes_every_waiter(tmp_path: Any, where: str, gates: Gates) -> None:
    with open_queue(1) as q:
        held, _, go = hold(q, gates, "held")
        if where == "pending":
            job = Job("shared", jobs.square, args=(2,))
            first = q.push(job)
        else:
            go.open()
            held.result(timeout=WAIT)
            gate = gates("shared")
            job = Job("shared", jobs.signal_and_wait, args=(gate.started, gate.go))
            first = q.push(job)
            wait_started(first.handle, gate.started)
        joined = [q.push(job) for _ in range(2)]
        assert isinstance(first, Queued) and all(isinstance(o, InFlight) for o in joined)
        handles = [first.handle] + [o.handle for o in joined]

        # Two threads blocked in result(), and a task awaiting the third handle.
        waiters = [BlockingCall(lambda h=h: h.result(timeout=WAIT)) for h in handles[:2]]
        for waiter in waiters:
            waiter.wait_blocked()
        awaiting = threading.Event()
        errors: list[BaseException] = []

        async def in_task(handle: Any) -> None:
            # Runs once the task has yielded inside ``await handle``, i.e. once it waits.
            asyncio.get_running_loop().call_soon(awaiting.set)
            try:
                await handle
            except BaseException as exc:  # checked below
                errors.append(exc)

        task_thread = threading.Thread(target=asyncio.run, args=(in_task(handles[2]),), daemon=True)
        task_thread.start()
        assert awaiting.wait(WAIT)

        assert q.cancel("shared") is True
        for waiter in waiters:
            with pytest.raises(JobFailed) as info:
                waiter.outcome()
            errors.append(info.value)
        task_thread.join(WAIT)
        assert not task_thread.is_alive()
        assert len(errors) == 3 and all(type(e) is JobFailed for e in errors)
        failures = {e.failure for e in errors}  # type: ignore[attr-defined]
        assert len(failures) == 1
        (failure,) = failures
        assert failure.kind == "cancelled" and q.state("shared") == Failed(failure)
        if where == "pending":
            go.open()
            held.result(timeout=WAIT)
        assert q.stats().failed == 1
