"""Results and exceptions are unpickled in the supervisor, and unpickling runs
code of the result's classes. That code must only ever fail its own job (kind
"error"), never charge another job, re-run one, stop the queue or stall
another lane."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import jobs
import jobs_hardening as hj
import pytest
from core_support import failure_of, open_queue, read_log

from procq import Completed, Job, Lane


@pytest.mark.parametrize("raised", ["ValueError", "SystemExit", "KeyboardInterrupt"])
def test_a_result_that_cannot_be_unpickled_fails_only_its_own_job(raised: str) -> None:
    with open_queue(1) as q:
        handle = q.push(Job("bad-result", hj.result_raising_on_unpickle, args=(raised,))).handle
        failure = failure_of(handle, "error")
        assert raised in failure.message
        assert "unpickl" in failure.message
        # The queue, its worker and its other keys carry on.
        assert not q.closed
        assert q.push_and_wait(Job("next", jobs.square, args=(3,))) == 9
        lane = q.stats().lanes["default"]
        assert lane.worker_restarts == 0 and lane.crashes == 0
        q._check_invariants()


def test_one_bad_report_among_many_read_at_once(tmp_path: Path) -> None:
    """Short jobs are sent ahead to a busy worker and their reports read in
    bulk: the one whose result fails to unpickle fails alone, as "error", and
    every other job completes having run exactly once.

    To have many reports arrive together, the first job's result takes until
    the last job has run to unpickle."""
    log = str(tmp_path / "runs")
    gate = jobs.fifo(tmp_path, "gate")
    last_ran = jobs.fifo(tmp_path, "last-ran")
    n, bad = 12, 5
    with open_queue({"one": Lane(workers=1)}) as q:
        # A few quick jobs first: only once a lane's jobs are known to be short
        # are more sent ahead to a busy worker.
        for i in range(20):
            assert q.push_and_wait(Job(f"warm:{i}", jobs.square, args=(i,))) == i * i
        # Hold the only worker so the next jobs pile up behind it and are sent ahead together.
        first = q.push(Job("hold", jobs.wait_released, args=(gate,))).handle
        handles = [q.push(Job("job:0", hj.result_blocking_on_unpickle, args=(last_ran, 0))).handle]
        for i in range(1, n):
            tag = f"job:{i}"
            if i == bad:
                job = Job(tag, hj.logged_raising_on_unpickle, args=(log, tag))
            elif i == n - 1:
                job = Job(tag, hj.logged_then_signal, args=(log, tag, i, last_ran))
            else:
                job = Job(tag, hj.logged, args=(log, tag, i))
            handles.append(q.push(job).handle)
        fd = jobs.release(gate)
        try:
            first.result(timeout=30)
            for i, handle in enumerate(handles):
                if i == bad:
                    failure = failure_of(handle, "error")
                    assert "unpickl" in failure.message
                else:
                    assert handle.result(timeout=30) == i
        finally:
            os.close(fd)
        assert sorted(read_log(log)) == sorted(f"job:{i}" for i in range(1, n)), "a job ran twice or never"
        lane = q.stats().lanes["one"]
        assert lane.worker_restarts == 0 and lane.crashes == 0
        q._check_invariants()


def test_a_slow_unpickle_does_not_stall_another_lane(tmp_path: Path) -> None:
    """While one lane's result takes as long as it likes to unpickle, another
    lane's jobs run, answer, and time out on time."""
    gate = jobs.fifo(tmp_path, "unpickle-gate")
    with open_queue({"slow": 1, "other": Lane(workers=1)}) as q:
        slow = q.push(Job("slow-result", hj.result_blocking_on_unpickle, args=(gate, "late"), lane="slow")).handle
        try:
            # The other lane answers while the slow result is still being unpickled.
            for i in range(5):
                assert q.push_and_wait(Job(f"other:{i}", jobs.square, args=(i,), lane="other"), timeout=30) == i * i
            timed = q.push(Job("other:timeout", jobs.sleep, args=(60,), lane="other", timeout=0.5)).handle
            failure_of(timed, "timeout", timeout=30)
            assert not slow.done()
        finally:
            fd = jobs.release(gate)
        try:
            assert slow.result(timeout=30) == "late"
        finally:
            os.close(fd)
        assert q.state("slow-result") == Completed("late")


def test_a_slow_unpickle_in_one_lane_does_not_block_close_without_waiting(tmp_path: Path) -> None:
    gate = jobs.fifo(tmp_path, "unpickle-gate")
    # (The context manager is kept: were it collected, its generator would close the queue at once.)
    context = open_queue({"slow": 1})
    q = context.__enter__()
    handle = q.push(Job("slow-result", hj.result_blocking_on_unpickle, args=(gate, "late"))).handle
    # The lane's only worker has reported that result, and is free again, once a later job has run.
    assert q.push_and_wait(Job("after", jobs.square, args=(2,)), timeout=20) == 4
    assert not handle.done()
    closer = threading.Thread(target=q.close, kwargs={"wait": False})
    try:
        closer.start()
        closer.join(timeout=20)
        assert not closer.is_alive(), "close(wait=False) waited for a result's unpickling"
        assert handle.done()
        assert failure_of(handle, "cancelled", timeout=0)
    finally:
        fd = jobs.release(gate)
        closer.join(timeout=20)
        os.close(fd)
        context.__exit__(None, None, None)
