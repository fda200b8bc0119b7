"""Closing a queue: push after close raises QueueClosed, close is idempotent; the context manager
waits for jobs (even when its body raises) but not on KeyboardInterrupt; close(wait=True) lets
running, waiting and blocked pushes finish, close(wait=False) cancels them."""

from __future__ import annotations

import asyncio
from typing import Any

import jobs
import jobs_core
import psutil
import pytest
from core_support import WAIT, BlockingCall, Gates, OnPickle, open_queue, read_log

from procq import (
    Completed,
    Failed,
    InFlight,
    Job,
    JobFailed,
    Lane,
    Pending,
    Processing,
    ProcQueue,
    ProcQueueError,
    QueueClosed,
    Queued,
)


def test_push_after_close_raises_queue_closed_and_close_is_idempotent(log: str) -> None:
    q = ProcQueue(lanes=1)
    try:
        pid = q.push_and_wait(Job("done", jobs_core.record, args=(log,)), timeout=WAIT)
        q.close()
        assert q.closed
        assert q._worker_pids() == []
        with pytest.raises(QueueClosed, match=r"^the queue is closed; cannot push job 'new'$") as info:
            q.push(Job("new", jobs.getpid))
        assert isinstance(info.value, ProcQueueError)
        with pytest.raises(QueueClosed, match=r"^the queue is closed; cannot push job 'done'$"):
            q.push(Job("done", jobs.getpid))
        with pytest.raises(QueueClosed, match=r"^the queue is closed; cannot push job 'new'$"):
            q.push_and_wait(Job("new", jobs.getpid), timeout=WAIT)

        async def main() -> None:
            with pytest.raises(QueueClosed, match=r"^the queue is closed; cannot push job 'new'$"):
                await q.apush(Job("new", jobs.getpid))
            with pytest.raises(QueueClosed, match=r"^the queue is closed; cannot push job 'new'$"):
                await q.apush_and_wait(Job("new", jobs.getpid))

        asyncio.run(main())
        # What the queue knew stays readable.
        assert q.state("done") == Completed(pid)
        assert q.state("new") is None
        q.close()
        q.close(wait=False)
        assert q.closed and q._worker_pids() == []
    finally:
        q.close(wait=False)
    assert read_log(log) == [f"ran {pid}"]


def test_the_context_manager_closes_waiting_for_jobs(log: str) -> None:
    with ProcQueue(lanes=1) as q:
        assert isinstance(q, ProcQueue) and not q.closed
        handles = [q.push(Job(f"k{i}", jobs_core.record, args=(log, f"k{i}"))).handle for i in range(3)]
    assert q.closed and q._worker_pids() == []
    assert all(h.done() for h in handles)
    pids = [h.result(timeout=0) for h in handles]
    assert read_log(log) == [f"k{i} {pid}" for i, pid in enumerate(pids)]
    with pytest.raises(QueueClosed):
        q.push(Job("after", jobs.getpid))


def test_the_context_manager_closes_waiting_when_its_body_raises(log: str) -> None:
    with pytest.raises(RuntimeError, match=r"^inside the block$"), ProcQueue(lanes=1) as q:
        handle = q.push(Job("k", jobs_core.record, args=(log,))).handle
        raise RuntimeError("inside the block")
    assert q.closed and q._worker_pids() == []
    assert handle.done()
    assert read_log(log) == [f"ran {handle.result(timeout=0)}"]


def test_the_context_manager_on_keyboard_interrupt_closes_without_waiting(gates: Gates, log: str) -> None:
    gate = gates("held")
    with pytest.raises(KeyboardInterrupt), ProcQueue(lanes=1) as q:
        held = q.push(Job("held", jobs_core.record_signal_wait, args=(log, gate.started, gate.go))).handle
        gate.wait_started()
        raise KeyboardInterrupt
    assert q.closed and q._worker_pids() == []
    with pytest.raises(JobFailed, match=r"^job 'held' failed: cancelled: ") as info:
        held.result(timeout=WAIT)
    assert info.value.failure.kind == "cancelled"


def test_close_waiting_lets_running_and_waiting_jobs_complete(gates: Gates, log: str) -> None:
    with open_queue({"one": 1}) as q:
        gate = gates("running")
        running = q.push(Job("running", jobs_core.record_signal_wait, args=(log, gate.started, gate.go, "running")))
        pid = gate.wait_started()
        waiting = q.push(Job("waiting", jobs_core.record, args=(log, "waiting")))
        assert q.state("waiting") == Pending()

        closing = BlockingCall(lambda: q.close(wait=True))
        closing.wait_blocked()  # close() is waiting for the jobs
        with pytest.raises(QueueClosed, match=r"^the queue is closed; cannot push job 'late'$"):
            q.push(Job("late", jobs.getpid))
        assert q.state("running") == Processing() and q.state("waiting") == Pending()
        assert not running.handle.done()

        gate.open()
        assert closing.outcome() is None
        assert q._worker_pids() == []
        assert running.handle.result(timeout=0) == pid
        assert waiting.handle.result(timeout=0) == pid
        assert q.state("running") == Completed(pid) and q.state("waiting") == Completed(pid)
        assert read_log(log) == [f"running {pid}", f"waiting {pid}"]


def test_close_waiting_lets_a_push_blocked_for_room_in_and_runs_it(gates: Gates, log: str) -> None:
    # The blocked push claimed its key before close(): it is not a new push,
    # so close(wait=True) waits for it like any other waiting job.
    with open_queue({"one": Lane(workers=1, capacity=1)}) as q:
        gate = gates("running")
        running = q.push(Job("running", jobs_core.record_signal_wait, args=(log, gate.started, gate.go, "running")))
        pid = gate.wait_started()
        waiting = q.push(Job("waiting", jobs_core.record, args=(log, "waiting")))
        blocked = BlockingCall(lambda: q.push(Job("blocked", jobs_core.record, args=(log, "blocked"))))
        blocked.wait_blocked()
        closing = BlockingCall(lambda: q.close(wait=True))
        closing.wait_blocked()
        gate.open()
        outcome = blocked.outcome()
        assert type(outcome) is Queued
        assert closing.outcome() is None
        assert q._worker_pids() == []
        assert [h.result(timeout=0) for h in (running.handle, waiting.handle, outcome.handle)] == [pid] * 3
        assert read_log(log) == [f"running {pid}", f"waiting {pid}", f"blocked {pid}"]


def test_close_without_waiting_cancels_waiting_and_running_jobs(gates: Gates, log: str) -> None:
    with open_queue({"one": Lane(workers=1, capacity=1)}, on_mismatch="ignore") as q:
        gate = gates("running")
        running = q.push(Job("running", jobs_core.record_signal_wait, args=(log, gate.started, gate.go, "running")))
        pid = gate.wait_started()
        waiting = q.push(Job("waiting", jobs_core.record, args=(log, "waiting")))
        joined = q.push(Job("waiting", jobs_core.record, args=(log, "joined")))
        assert type(joined) is InFlight
        blocked = BlockingCall(lambda: q.push(Job("blocked", jobs_core.record, args=(log, "blocked"))))
        blocked.wait_blocked()
        assert q.state("blocked") == Pending()
        worker = psutil.Process(pid)

        q.close(wait=False)

        assert q._worker_pids() == []
        assert not worker.is_running()  # killed and reaped
        for name, outcome in (("running", running), ("waiting", waiting), ("waiting", joined)):
            with pytest.raises(
                JobFailed,
                match=rf"^job '{name}' failed: cancelled: job '{name}' was cancelled: "
                r"the queue was closed without waiting$",
            ) as info:
                outcome.handle.result(timeout=WAIT)
            assert info.value.failure.kind == "cancelled"
            state = q.state(name)
            assert isinstance(state, Failed) and state.failure.kind == "cancelled"
        assert running.handle.state.failure.pid == pid  # type: ignore[union-attr]
        # The push still waiting for room never got in: QueueClosed, the key as it was.
        with pytest.raises(QueueClosed, match=r"^the queue was closed while job 'blocked' waited for room$"):
            blocked.outcome()
        assert q.state("blocked") is None
        assert read_log(log) == [f"running {pid}"]  # neither of the others ever ran
        with pytest.raises(QueueClosed):
            q.push(Job("running", jobs.getpid))


def test_close_without_waiting_cancels_a_push_that_claimed_its_key_just_before(gates: Gates, log: str) -> None:
    """A push claims its key, then close(wait=False) runs (from another thread)
    before the push reaches its lane: that job is waiting, so it is cancelled
    too (or the push raises QueueClosed); it never runs, and close(wait=False)
    does not wait for it."""
    with open_queue({"one": 1}) as q:
        running_gate, late_gate = gates("running"), gates("late")
        running = q.push(
            Job("running", jobs_core.record_signal_wait, args=(log, running_gate.started, running_gate.go, "running"))
        )
        running_gate.wait_started()
        waiting = q.push(Job("waiting", jobs_core.record, args=(log, "waiting")))
        closing: dict[str, BlockingCall] = {}

        def close_meanwhile() -> None:  # runs inside the push of "late", after its claim
            closing["call"] = BlockingCall(lambda: q.close(wait=False))
            # Once "waiting" is cancelled, close(wait=False) has cancelled what it saw.
            with pytest.raises(JobFailed, match="cancelled"):
                waiting.handle.result(timeout=WAIT)

        late = Job("late", jobs_core.record_and_wait, args=(log, late_gate.go, OnPickle(close_meanwhile, "late")))
        try:
            try:
                outcome: Any = q.push(late)
            except QueueClosed:
                outcome = None
            closing["call"].outcome(timeout=10)  # close(wait=False) returns: it never waits for a job
            if outcome is not None:
                with pytest.raises(JobFailed, match="cancelled"):
                    outcome.handle.result(timeout=WAIT)
            assert not any(line.startswith("late ") for line in read_log(log))
            with pytest.raises(JobFailed, match="cancelled"):
                running.handle.result(timeout=WAIT)
        finally:
            late_gate.open()  # if "late" did start, let it end so nothing hangs
            if "call" in closing:
                closing["call"].outcome(timeout=WAIT)
