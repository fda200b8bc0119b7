"""Memory limits (a job's own memory_limit or its lane's): a job past its limit fails alone, with
kind "memory", its worker is replaced, and the limit ends with the job."""

from __future__ import annotations

import resource
from typing import Any

import jobs
import jobs_control
import pytest
from core_support import WAIT, Gates, failure_of, hold, open_queue
from process_support import linux_only

from procq import Job, Lane

pytestmark = pytest.mark.skipif(not linux_only, reason="job control relies on Linux process groups and /proc")
MIB = 1 << 20


@pytest.mark.parametrize("where", ["job", "lane"])
def test_a_job_past_its_memory_limit_fails_alone(start_method: str, tmp_path: Any, where: str, gates: Gates) -> None:
    lane = Lane(workers=2, memory_limit="64M" if where == "lane" else None)
    own = "64M" if where == "job" else None
    supervisor_limit = resource.getrlimit(resource.RLIMIT_AS)
    with open_queue({"m": lane}, start_method=start_method) as q:
        other, other_pid, other_go = hold(q, gates, "other")
        handle = q.push(Job("greedy", jobs_control.allocate, args=(300,), memory_limit=own)).handle
        failure = failure_of(handle, "memory")
        assert failure.exc_type == "MemoryError"
        assert failure.message == "MemoryError (the job went over its memory_limit of 64 MiB)"
        assert failure.pid != other_pid
        lane_stats = q.stats().lanes["m"]
        assert (lane_stats.failed, lane_stats.crashes) == (1, 0)
        # The supervisor and the other job are unharmed.
        assert resource.getrlimit(resource.RLIMIT_AS) == supervisor_limit
        other_go.open()
        assert other.result(timeout=WAIT) == other_pid
        # Within the limit the same allocation-sized work passes, and the key is retryable.
        assert (
            q.push_and_wait(Job("greedy", jobs_control.allocate, args=(16,), memory_limit=own), timeout=WAIT)
            == 16 * MIB
        )
        # A job's own limit beats its lane's: here a larger one.
        assert (
            q.push_and_wait(Job("roomy", jobs_control.allocate, args=(200,), memory_limit="1G"), timeout=WAIT)
            == 200 * MIB
        )


def test_a_memory_limited_job_is_not_charged_for_what_its_worker_kept_of_earlier_results() -> None:
    """A trusted worker keeps the shared-memory segments of its last large
    results, to write the next ones into, and maps them while it waits. A
    job with a memory limit sent to it just after such a result counts its
    memory from its own start: 30 MiB under a 64 MiB limit passes, however
    large the result before it (here 200-375 MiB, whose pages the worker
    maps as the job is sent); 100 MiB still fails. (Each result is larger than
    the last, so that each goes into a new segment, which the worker maps
    as it waits.)"""
    import jobs_arrays

    with open_queue({"m": Lane(workers=1)}) as q:
        for i in range(8):
            size = (200 + 25 * i) * MIB
            big = q.push(Job(f"big-{i}", jobs_arrays.zeros, args=(size // 8,))).handle
            small = q.push(Job(f"small-{i}", jobs_control.allocate_for, args=(30, 0.3), memory_limit="64M")).handle
            assert big.result(timeout=WAIT).nbytes == size
            assert small.result(timeout=WAIT) == 30 * MIB
        big = q.push(Job("big-last", jobs_arrays.zeros, args=(300 * MIB // 8,))).handle
        greedy = q.push(Job("greedy", jobs_control.allocate_for, args=(100, 0.3), memory_limit="64M")).handle
        assert big.result(timeout=WAIT).nbytes == 300 * MIB
        failure_of(greedy, "memory")


def test_a_memory_limit_ends_with_its_job(start_method: str) -> None:
    """The address-space limit is set around one job: the worker's next job,
    with no limit, may use more."""
    with open_queue({"m": Lane(workers=1)}, start_method=start_method) as q:
        pid = q.push_and_wait(Job("pid", jobs.getpid), timeout=WAIT)
        assert (
            q.push_and_wait(Job("limited", jobs_control.allocate, args=(16,), memory_limit="64M"), timeout=WAIT)
            == 16 * MIB
        )
        assert q.push_and_wait(Job("unlimited", jobs_control.allocate, args=(200,)), timeout=WAIT) == 200 * MIB
        assert q.push_and_wait(Job("pid-again", jobs.getpid), timeout=WAIT) == pid


def test_the_worker_of_a_job_past_its_memory_limit_is_replaced() -> None:
    with open_queue({"m": Lane(workers=1, memory_limit="64M")}) as q:
        failure = failure_of(q.push(Job("greedy", jobs_control.allocate, args=(300,))).handle, "memory")
        assert q.push_and_wait(Job("after", jobs.getpid), timeout=WAIT) != failure.pid
        assert q.stats().lanes["m"].worker_restarts == 1


def test_a_memory_error_raised_by_a_job_is_kind_memory(start_method: str) -> None:
    with open_queue(1, start_method=start_method) as q:
        handle = q.push(Job("oom", jobs_control.raise_memory_error, args=("out of room",))).handle
        failure = failure_of(handle, "memory")
        assert (failure.exc_type, failure.message) == ("MemoryError", "MemoryError: out of room")
        assert failure.traceback is not None and "MemoryError: out of room" in failure.traceback
        assert q.push_and_wait(Job("after", jobs.square, args=(2,)), timeout=WAIT) == 4
