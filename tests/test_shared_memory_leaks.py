"""No shared-memory segment outlives its use, whatever dies: a worker killed
in the middle of a job (its argument's segment, a result's it never sent), a
job cancelled or timed out, a result never read, a handle dropped, a queue
closed without waiting, and the supervisor itself killed (its undertaker
removes what it and its workers left). An argument's segment is kept for
reuse while its queue is open: a death frees it for the next job, and
closing the queue removes it."""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import uuid
import warnings
from pathlib import Path
from typing import Any

import jobs_arrays
import numpy as np
import psutil
import pytest
from core_support import WAIT, Gates, open_queue
from process_support import descendants_tagged, kill_and_reap, linux_only, tagged_program
from test_shared_memory import BIG, result_segments, segments

from procq import Job, JobFailed, Lane, ProcQueue
from procq._wire.shm_results import KEEP_RESULT_SEGMENTS

TESTS_DIR = str(Path(__file__).parent)


def _big() -> Any:
    return np.ones(BIG)


def test_a_worker_killed_holding_a_large_argument(gates: Gates) -> None:
    gate = gates("g")
    with open_queue(1) as q:
        handle = q.push(Job("k", jobs_arrays.hold, args=(_big(), gate.started, gate.go))).handle
        pid = gate.wait_started()
        assert len(segments()) == 1  # the argument's, mapped by the worker
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(JobFailed) as info:
            handle.result(timeout=WAIT)
        assert info.value.failure.kind == "crashed"
        held = segments()
        # The dead worker's hold on it went with it: the next job reuses it.
        assert q.push_and_wait(Job("next", jobs_arrays.total, args=(_big(),)), timeout=WAIT) == BIG
        assert segments() == held
    assert segments() == []


def test_a_worker_killed_after_writing_a_result_it_never_sent() -> None:
    with open_queue(1) as q:
        with pytest.raises(JobFailed) as info:
            q.push_and_wait(Job("d", jobs_arrays.write_result_segment_and_die, args=(os.getpid(), BIG)), timeout=WAIT)
        assert info.value.failure.kind == "crashed"
        assert result_segments() == []  # removed as the worker was reaped


def test_a_cancelled_job_running_and_one_waiting(gates: Gates) -> None:
    gate = gates("c")
    with open_queue(1) as q:
        running = q.push(Job("run", jobs_arrays.hold, args=(_big(), gate.started, gate.go))).handle
        waiting = q.push(Job("wait", jobs_arrays.total, args=(_big(),))).handle
        gate.wait_started()
        assert len(segments()) == 2
        assert q.cancel("wait") and q.cancel("run")
        for handle in (running, waiting):
            with pytest.raises(JobFailed, match="cancel"):
                handle.result(timeout=WAIT)
        q.push_and_wait(Job("after", jobs_arrays.total, args=(np.ones(3),)), timeout=WAIT)  # (the run's worker is gone)
        assert len(segments()) == 2  # kept for reuse
    assert segments() == []


def test_a_job_timed_out(gates: Gates) -> None:
    gate = gates("t")
    with open_queue(1) as q:
        handle = q.push(Job("t", jobs_arrays.hold, args=(_big(), gate.started, gate.go), timeout=0.5)).handle
        gate.wait_started()
        with pytest.raises(JobFailed) as info:
            handle.result(timeout=WAIT)
        assert info.value.failure.kind == "timeout"
        q.push_and_wait(Job("after", jobs_arrays.total, args=(np.ones(3),)), timeout=WAIT)
    assert segments() == []


def test_a_result_never_read_and_a_handle_dropped() -> None:
    with open_queue(1) as q:
        handle = q.push(Job("unread", jobs_arrays.times_two, args=(_big(),))).handle
        q.push(Job("dropped", jobs_arrays.times_two, args=(_big(),)))  # (its handle dropped at once)
        gc.collect()
        q.push_and_wait(Job("after", jobs_arrays.total, args=(np.ones(3),)), timeout=WAIT)  # (the lane runs in order)
        assert handle.done() and q.state("dropped") is not None
        # The results are the records' now, mapped; their worker keeps the names (to write again once free).
        assert len(result_segments()) <= KEEP_RESULT_SEGMENTS
        assert q.forget("unread") and q.forget("dropped")
        del handle
        gc.collect()
        assert jobs_arrays.mapped_ranges() == []
    assert segments() == []


def test_close_without_waiting(gates: Gates) -> None:
    held, result = gates("held"), gates("result")
    q = ProcQueue({"a": Lane(workers=1), "b": Lane(workers=1)})
    try:
        q.push(Job("run", jobs_arrays.hold, args=(_big(), held.started, held.go), lane="a"))
        q.push(Job("wait", jobs_arrays.total, args=(_big(),), lane="a"))
        q.push(Job("result", jobs_arrays.result_after_wait, args=(BIG, result.started, result.go), lane="b"))
        held.wait_started()
        result.wait_started()
        result.open()  # (the result may be on its way as the queue closes)
    finally:
        q.close(wait=False)
    assert q._worker_pids() == []
    assert segments() == []


_SUPERVISOR = """
import json, os, sys
sys.path.insert(0, {tests!r})
import numpy as np
import jobs_arrays
from procq import Job, ProcQueue


def main():
    held_started, held_go, result_started, result_go = sys.argv[1:5]
    q = ProcQueue(2)
    q.push(Job("first", jobs_arrays.total, args=(np.ones(3),))).handle.result()  # (the undertaker is up)
    q.push(Job("held", jobs_arrays.hold, args=(np.ones({n}), held_started, held_go)))
    q.push(Job("result", jobs_arrays.result_after_wait, args=({n}, result_started, result_go)))
    print(json.dumps(os.getpid()), flush=True)
    sys.stdin.read()  # until killed


if __name__ == "__main__":
    main()
"""


@pytest.mark.skipif(not linux_only, reason="needs PR_SET_CHILD_SUBREAPER to see the undertaker exit")
@pytest.mark.timeout(60)
def test_the_supervisor_killed(tmp_path: Path, gates: Gates) -> None:
    """Its argument's segment is there, and a result's is being written or
    sent, when the supervisor is SIGKILLed: the undertaker removes both."""
    held, result = gates("held"), gates("result")
    script = tmp_path / "supervisor.py"
    script.write_text(_SUPERVISOR.format(tests=TESTS_DIR, n=BIG))
    tag = uuid.uuid4().hex
    argv = [sys.executable, str(script), held.started, held.go, result.started, result.go]
    with tagged_program(argv, tag) as proc:
        supervisor = json.loads(proc.stdout.readline())
        held.wait_started()
        result.wait_started()
        result.open()
        prefix = f"procq-{supervisor}-"
        assert any(name.startswith(prefix) for name in os.listdir("/dev/shm"))  # (the held job's argument)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        # Every process it left (its workers, the undertaker) exits on its own:
        # the undertaker last, once it has removed the segments.
        left = descendants_tagged(tag)
        _, alive = psutil.wait_procs(left, timeout=WAIT)
        kill_and_reap(alive)
        assert alive == []
        assert [name for name in os.listdir("/dev/shm") if name.startswith(prefix)] == []


def test_a_forked_child_exiting_leaves_the_queues_segments_alone() -> None:
    with open_queue(1) as q:
        assert q.push_and_wait(Job("a", jobs_arrays.total, args=(_big(),)), timeout=WAIT) == BIG
        held = segments()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # forking a threaded process
            pid = os.fork()
        if pid == 0:  # the child exits as a program does: the queue's exit finalizer runs
            code = 0
            try:
                q._pusher.segments._finalizer()
            except BaseException:
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert segments() == held
        assert q.push_and_wait(Job("b", jobs_arrays.total, args=(_big(),)), timeout=WAIT) == BIG
    assert segments() == []


@pytest.mark.parametrize("store", [None, "sqlite"])
def test_nothing_mapped_waits_for_the_garbage_collector(tmp_path: Path, store: str | None) -> None:
    """With the cyclic garbage collector off, a result is unmapped as soon as
    nothing holds it: one read by a function that a failure (a worker that
    died) then passed through, and one a store's queue kept for its key.
    Neither procq's failure nor its records make a reference cycle that
    would hold them until a collection ran."""
    import jobs

    def read_then_fail(q: ProcQueue) -> None:
        kept = q.push_and_wait(Job("big", jobs_arrays.times_two, args=(_big(),)), timeout=WAIT)
        assert jobs_arrays.in_segment(kept)
        q.push_and_wait(Job("dies", jobs.exit_now, args=(3,)), timeout=WAIT)

    url = None if store is None else f"sqlite:///{tmp_path / 'store.db'}"
    gc.collect()
    gc.disable()
    try:
        with open_queue(1, **({} if url is None else {"store": url})) as q:
            try:
                read_then_fail(q)
            except JobFailed as exc:
                assert exc.failure.kind == "crashed"
            else:
                pytest.fail("the job that exits did not fail")
            failed = q.push(Job("fails", jobs_arrays.total, args=("not an array",))).handle  # type: ignore[union-attr]
            with pytest.raises(JobFailed):
                failed.result(timeout=WAIT)
            del failed
            assert q.forget("big")
            assert jobs_arrays.mapped_ranges() == []
    finally:
        gc.enable()
