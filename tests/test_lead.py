"""A caller waiting on its own running job reads the worker's answer itself
(procq/_supervisor/lead.py), and everything the I/O thread would have done
with that answer still happens: crashes, recycling, timeouts and cancels
while a caller leads end the same way as without one."""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jobs
import pytest
from core_support import WAIT, Gate, Gates, failure_of, open_queue, wait_until

from procq import Job, JobFailed, Lane

pytestmark = pytest.mark.timeout(120)


def _leading(q: Any) -> bool:
    """Is some caller reading a worker's pipe (the I/O thread passing over it)?"""
    return bool(q._supervisor._watcher._paused)


def _hold(q: Any, gates: Gates, key: str) -> tuple[Any, int, Gate]:
    """Push a job that reports its pid and waits at its gate; (handle, pid, gate).
    (Not ``core_support.hold``: its watch thread waits on the handle, and
    would lead in these tests' place.)"""
    gate = gates(key)
    handle = q.push(Job(key, jobs.signal_and_wait, args=(gate.started, gate.go))).handle
    return handle, gate.wait_started(), gate


def _lead_in_thread(handle: Any, **kwargs: Any) -> tuple[threading.Thread, list[Any]]:
    """Wait on ``handle`` in a thread of its own; what it got (value or exception), and on which thread."""
    got: list[Any] = []

    def wait() -> None:
        try:
            got.append(handle.result(**kwargs))
        except BaseException as exc:  # the test reads it
            got.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    return thread, got


def test_a_waiter_settles_its_own_job_on_its_own_thread(gates: Gates) -> None:
    with open_queue(1) as q:
        handle, _, gate = _hold(q, gates, "held")
        ended_on: list[threading.Thread] = []
        handle.add_done_callback(lambda _: ended_on.append(threading.current_thread()))
        thread, got = _lead_in_thread(handle, timeout=WAIT)
        wait_until(lambda: _leading(q), what="the waiter reading the worker's pipe")
        gate.open()
        thread.join(WAIT)
        assert got and not isinstance(got[0], BaseException), got
        assert ended_on == [thread]  # settled by the waiter, not the I/O thread
        assert not _leading(q)
        assert q.push_and_wait(Job("next", jobs.square, args=(5,)), timeout=WAIT) == 25


def test_a_waiters_timeout_leaves_the_job_running(gates: Gates) -> None:
    with open_queue(1) as q:
        handle, _, gate = _hold(q, gates, "held")
        with pytest.raises(TimeoutError):
            handle.result(timeout=0.2)
        assert not _leading(q)
        gate.open()
        assert isinstance(handle.result(timeout=WAIT), int)


def test_a_caller_polling_with_a_zero_timeout_gets_its_output(gates: Gates) -> None:
    """``result(timeout=0)`` in a tight loop holds the worker's pipe whenever
    the I/O thread looks at it: each poll must read what has arrived, or the
    answer sits in the pipe for ever. Many jobs, one at a time, so that the
    two threads meet."""
    with open_queue(2) as q:
        handle, _, gate = _hold(q, gates, "held")
        for _ in range(100):  # a running job: every poll times out, and leaves it running
            with pytest.raises(TimeoutError):
                handle.result(timeout=0)
        gate.open()
        outputs = []
        for i in range(-1, 300):
            one = handle if i < 0 else q.push(Job(f"k{i}", jobs.square, args=(i,))).handle
            deadline = time.monotonic() + WAIT
            while True:
                try:
                    outputs.append(one.result(timeout=0))
                    break
                except TimeoutError:
                    assert time.monotonic() < deadline, f"{one.key} never seen done by result(timeout=0)"
        assert outputs[1:] == [i * i for i in range(300)]
        assert not _leading(q)


@pytest.mark.parametrize("how", ["sigkill", "cancel"])
def test_a_job_ended_under_a_leading_waiter_wakes_it(gates: Gates, how: str) -> None:
    with open_queue(1) as q:
        handle, pid, _ = _hold(q, gates, "held")
        thread, got = _lead_in_thread(handle, timeout=WAIT)
        wait_until(lambda: _leading(q), what="the waiter reading the worker's pipe")
        if how == "sigkill":
            os.kill(pid, signal.SIGKILL)
        else:
            assert q.cancel("held")
        thread.join(WAIT)
        assert len(got) == 1 and isinstance(got[0], JobFailed), got
        failure = got[0].failure
        if how == "sigkill":
            assert (failure.kind, failure.signal) == ("crashed", "SIGKILL"), failure
        else:
            assert failure.kind == "cancelled", failure
        # The worker is replaced and the queue goes on.
        assert q.push_and_wait(Job("next", jobs.square, args=(6,)), timeout=WAIT) == 36


def test_many_waiters_with_crashes_and_recycled_workers() -> None:
    """Threads that each push and wait on their own jobs, on workers recycled
    every three jobs, with every seventh job killing its worker: every answer
    is right, every crash reported as such, nothing left behind."""

    def run(i: int) -> tuple[int, Any]:
        if i % 7 == 3:
            handle = q.push(Job(f"crash-{i}", jobs.sigkill_self)).handle
            return i, failure_of(handle, "crashed")
        return i, q.push(Job(f"square-{i}", jobs.square, args=(i,))).handle.result(timeout=WAIT)

    with open_queue({"default": Lane(workers=2, max_jobs_per_worker=3)}) as q, ThreadPoolExecutor(8) as threads:
        for i, got in threads.map(run, range(120)):
            if i % 7 == 3:
                assert got.signal == "SIGKILL", got
            else:
                assert got == i * i
        assert q.stats().completed == 120 - len(range(3, 120, 7))


def test_a_result_that_needs_decoding_reaches_its_leading_waiter() -> None:
    """An object whose unpickling names a class is decoded on the lane's
    decode thread, never by the waiter that read it."""
    value = {"when": datetime.date(2026, 12, 3), "n": [1, 2.5]}
    with open_queue(1) as q:
        for i in range(20):
            assert q.push(Job(f"objects-{i}", jobs.identity, args=(value,))).handle.result(timeout=WAIT) == value


def test_an_executor_future_is_settled_on_the_thread_waiting_for_it(gates: Gates) -> None:
    """``Executor.submit(...).result()`` reads its own answer, as a handle's
    ``result`` does; ``result(timeout)`` past its time leaves the job running."""
    from procq import Executor

    with Executor(max_workers=1) as ex:
        gate = gates("held")
        future = ex.submit(jobs.signal_and_wait, gate.started, gate.go)
        pid = gate.wait_started()
        with pytest.raises(TimeoutError):
            future.result(timeout=0.2)
        ended_on: list[threading.Thread] = []
        future._handle.add_done_callback(lambda _: ended_on.append(threading.current_thread()))
        thread, got = _lead_in_thread(future, timeout=WAIT)
        wait_until(lambda: _leading(ex.queue), what="the waiter reading the worker's pipe")
        gate.open()
        thread.join(WAIT)
        assert got == [pid]
        assert ended_on == [thread]  # settled by the waiter, not the I/O thread
        assert future.exception(timeout=WAIT) is None and future.result() == pid


def test_a_pipe_a_waiter_hands_back_as_the_queue_stops_is_closed_once_unwatched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A waiter that stops reading a worker's pipe just as the queue stops is
    its last sender: it hands the pipe back to be closed, while the I/O
    thread, stopping the workers, closes the pipes no one is sending on. The
    pipe must leave the selector before either closes it (a closed pipe
    cannot be taken out), and the queue's shutdown must not fail."""
    failures: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: failures.append(args.exc_value))
    with open_queue(1) as q:
        assert q.push_and_wait(Job("boot", jobs.identity, args=(1,)), timeout=WAIT) == 1
        supervisor, core = q._supervisor, q._core
        (worker,) = supervisor._watcher.workers()
        stop = core.stop

        def stop_as_a_waiter_hands_back_its_pipe() -> None:
            stop()
            # What a leader whose read ended now does: Core.sent says the
            # queue stopped, so it, the last sender, hands the pipe back.
            with core.lock:
                worker.sending += 1
            assert core.sent(worker)
            supervisor._handoffs.close(worker)

        monkeypatch.setattr(core, "stop", stop_as_a_waiter_hands_back_its_pipe)
        q.close()
    assert failures == []
    assert worker.channel.messages.closed


def test_many_callers_waiting_on_one_job_cost_nothing_while_they_wait(gates: Gates) -> None:
    """One caller leads; the others wait to be woken, not trying again every
    slice: 500 threads waiting a second cost the process a few milliseconds
    of CPU (polling every 50 ms, they cost it a large part of a core), and
    every one gets the job's output."""
    import resource

    with open_queue(1) as q:
        handle, _, gate = _hold(q, gates, "held")
        waiting = [_lead_in_thread(handle, timeout=WAIT) for _ in range(500)]
        wait_until(lambda: _leading(q), what="a waiter reading the worker's pipe")
        before = resource.getrusage(resource.RUSAGE_SELF)
        time.sleep(1.0)  # (a window to measure the CPU the waiting takes, not a synchronisation)
        after = resource.getrusage(resource.RUSAGE_SELF)
        used = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        gate.open()
        for thread, _ in waiting:
            thread.join(WAIT)
        outputs = {repr(got) for _, got in waiting}
        assert len(outputs) == 1 and not isinstance(waiting[0][1][0], BaseException), outputs
        assert used < 0.1, f"{used:.3f} s of CPU in 1 s while 500 threads waited"
