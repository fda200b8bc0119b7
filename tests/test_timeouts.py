"""Time limits: a job's own timeout or its lane's, counted from the job's start; SIGTERM first,
then SIGKILL after the lane's kill_grace, and a job's SIGTERM handler runs before it dies.

A job that must be killed blocks on a FIFO nobody writes to; how long anything took is never
asserted (the kill latency is measured in bench/).
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import jobs
import jobs_control
import pytest
from core_support import WAIT, Gates, failure_of, hold, open_queue, wait_started
from process_support import linux_only

from procq import Job, Lane, Pending, Processing

pytestmark = pytest.mark.skipif(not linux_only, reason="job control relies on Linux process groups and /proc")


def test_a_jobs_own_timeout_beats_its_lanes(start_method: str, tmp_path: Any, gates: Gates) -> None:
    """A job without a timeout gets its lane's; one with its own keeps it, longer or shorter."""
    never = jobs.fifo(tmp_path, "never")  # never released: only a time limit ends these jobs
    with open_queue({"t": Lane(workers=2, timeout=0.3)}, start_method=start_method) as q:
        go = gates("own")
        own = q.push(Job("own", jobs.signal_and_wait, args=(go.started, go.go), lane="t", timeout=60)).handle
        own_pid = int(wait_started(own, go.started))
        default = q.push(Job("default", jobs.wait_released, args=(never,), lane="t")).handle
        failure = failure_of(default, "timeout")
        assert re.fullmatch(
            rf"job 'default' ran longer than the timeout of lane 't' of 0\.3s; its worker \(pid {failure.pid}\) "
            r"and that process's tree were killed",
            failure.message,
        ), failure.message
        assert failure.pid != own_pid
        # "own" started before "default", so it has run past the lane's 0.3s too, and lives on.
        assert q.state("own") == Processing()
        go.open()
        assert own.result(timeout=WAIT) == own_pid

        shorter = q.push(Job("shorter", jobs.wait_released, args=(never,), lane="t", timeout=0.2)).handle
        failure = failure_of(shorter, "timeout")
        assert failure.message.startswith("job 'shorter' ran longer than its timeout of 0.2s; its worker (pid ")
        lane = q.stats().lanes["t"]
        assert (lane.failed, lane.completed, lane.crashes, lane.worker_restarts) == (2, 1, 0, 2)
        assert (lane.workers_alive, lane.running) == (2, 0)


def test_a_timeout_counts_from_the_start_not_the_wait(start_method: str, tmp_path: Any, gates: Gates) -> None:
    """A job with a timeout that waits in its lane longer than that still runs."""
    never = jobs.fifo(tmp_path, "never")
    with open_queue({"one": 1, "clock": Lane(workers=1, timeout=0.3)}, start_method=start_method) as q:
        held, _, go = hold(q, gates, "held", lane="one")
        waiting = q.push(Job("waiting", jobs.square, args=(7,), lane="one", timeout=0.3)).handle
        # A clock: this job is pushed after "waiting" and runs 0.3s before it is killed.
        failure_of(q.push(Job("clock", jobs.wait_released, args=(never,), lane="clock")).handle, "timeout")
        assert q.state("waiting") == Pending()
        go.open()
        held.result(timeout=WAIT)
        assert waiting.result(timeout=WAIT) == 49


def test_a_timed_out_job_gets_sigterm_first(start_method: str, tmp_path: Any) -> None:
    """With the default grace, a job that does not handle SIGTERM dies of it;
    with ``kill_grace=0`` it gets SIGKILL at once."""
    never = jobs.fifo(tmp_path, "never")
    with open_queue(
        {"grace": Lane(timeout=0.3), "nograce": Lane(timeout=0.3, kill_grace=0)}, start_method=start_method
    ) as q:
        for lane, sig in (("grace", signal.SIGTERM), ("nograce", signal.SIGKILL)):
            failure = failure_of(q.push(Job(lane, jobs.wait_released, args=(never,), lane=lane)).handle, "timeout")
            assert (failure.signal, failure.exitcode) == (sig.name, -sig), failure
            assert failure.pid not in q._worker_pids()


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace(start_method: str, tmp_path: Any) -> None:
    with open_queue({"t": Lane(kill_grace=0.05)}, start_method=start_method) as q:
        # The job must have ignored SIGTERM before its time runs out; on a loaded
        # machine it may not have, and then the attempt is repeated with a longer limit.
        for attempt, limit in enumerate((0.5, 4.0, 16.0)):
            ready = str(tmp_path / f"ready-{attempt}")
            handle = q.push(
                Job(f"stubborn-{attempt}", jobs_control.ignore_sigterm_then_block, args=(ready,), timeout=limit)
            ).handle
            failure = failure_of(handle, "timeout", timeout=limit + WAIT)
            if os.path.exists(ready):
                break
        else:
            pytest.fail("the job never got as far as ignoring SIGTERM")
        assert int(Path(ready).read_text()) == failure.pid
        assert (failure.signal, failure.exitcode) == ("SIGKILL", -9)
        assert q.push_and_wait(Job("after", jobs.square, args=(5,)), timeout=WAIT) == 25


def test_a_job_that_handles_sigterm_runs_its_handler_before_it_dies(start_method: str, tmp_path: Any) -> None:
    cleaned = str(tmp_path / "cleaned")
    started = jobs.fifo(tmp_path, "started")
    # A long grace: the handler, not the SIGKILL, must be what ends the job.
    with open_queue({"t": Lane(kill_grace=30)}, start_method=start_method) as q:
        handle = q.push(Job("tidy", jobs_control.handle_sigterm_then_block, args=(started, cleaned))).handle
        pid = int(wait_started(handle, started))
        assert q.cancel("tidy") is True
        failure = failure_of(handle, "cancelled")
        assert (failure.pid, failure.signal, failure.exitcode) == (pid, "SIGTERM", -signal.SIGTERM)
        assert Path(cleaned).read_text() == f"cleaned up {pid}"
        assert q.push_and_wait(Job("after", jobs.square, args=(6,)), timeout=WAIT) == 36
