"""A trusted worker keeps the segments it writes large results into, and
writes a later result into one only once the supervisor is done with it
(``procq._wire.shm_results``): a result the caller still holds is never
written over, whatever the caller did to it; one larger than a worker keeps
has its name removed at once; an idle worker, and a worker's death, let go
of the names it kept,
and the caller's results stay readable. A worker that runs jobs with a memory
limit keeps its segments unmapped, and an argument a job reads counts towards
its limit."""

from __future__ import annotations

import gc
import os
import pickle
import signal

import jobs
import jobs_arrays
import numpy as np
import pytest
from core_support import WAIT, open_queue, wait_until
from test_shared_memory import BIG, no_trim, result_segments, segments

from procq import Job, JobFailed, Lane
from procq._wire.shm import SHM_DIR, segment_prefix
from procq._wire.shm_results import KEEP_RESULT_SEGMENTS, ResultSegments, map_result


def _rss_shmem(pid: int) -> int:
    """The shared memory in ``pid``'s resident set, in bytes (``RssShmem``)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssShmem:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssShmem in /proc/<pid>/status")


def test_a_worker_writes_its_next_result_into_the_segment_the_caller_let_go() -> None:
    with open_queue(1) as q:
        no_trim(q)
        names: set[str] = set()
        for i in range(5):
            out = q.push_and_wait(Job(f"r{i}", jobs_arrays.full, args=(BIG, float(i))), timeout=WAIT)
            assert jobs_arrays.in_segment(out) and np.array_equal(out, np.full(BIG, float(i)))
            names.update(result_segments())
            assert q.forget(f"r{i}")
            del out
            gc.collect()
        assert len(names) == 1  # one segment, written five times
        # Written again through a mapping the worker keeps: its pages count in the worker's resident set.
        pid = q.push_and_wait(Job("pid", jobs.getpid), timeout=WAIT)
        assert q.push_and_wait(Job("mapped", jobs_arrays.result_segments_mapped), timeout=WAIT) == 1
        assert _rss_shmem(pid) >= BIG * 8
    assert segments() == []


def test_a_result_still_held_is_never_written_over() -> None:
    with open_queue(1) as q:
        no_trim(q)
        held = [q.push_and_wait(Job(f"h{i}", jobs_arrays.full, args=(BIG, float(i))), timeout=WAIT) for i in range(4)]
        # The worker keeps the last two; the older two it dropped are the supervisor's to remove.
        assert len(result_segments()) == 4
        held[3][:] = -1.0  # the caller's own copy of what it writes: the worker's segment is untouched
        for i in range(4):
            assert q.forget(f"h{i}")
        del held[2:]
        gc.collect()
        for i in range(10, 14):
            out = q.push_and_wait(Job(f"n{i}", jobs_arrays.full, args=(BIG, float(i))), timeout=WAIT)
            assert np.array_equal(out, np.full(BIG, float(i)))
            assert q.forget(f"n{i}")
            del out
            gc.collect()
        # The two still held are as they came, though later results were written meanwhile.
        assert np.array_equal(held[0], np.zeros(BIG)) and np.array_equal(held[1], np.ones(BIG))
        del held
        gc.collect()
        assert len(result_segments()) <= KEEP_RESULT_SEGMENTS  # the dropped ones' names went with them
    assert segments() == []


def test_a_result_larger_than_a_worker_keeps_has_its_name_removed_at_once() -> None:
    with open_queue(1) as q:
        out = q.push_and_wait(Job("unkept", jobs_arrays.keep_no_results, args=(BIG,)), timeout=WAIT)
        assert jobs_arrays.in_segment(out) and np.array_equal(out, np.ones(BIG))
        assert result_segments() == []  # mapped, with no name left
        q.push_and_wait(Job("keep again", jobs_arrays.keep_results), timeout=WAIT)
    assert segments() == []


def test_a_worker_killed_removes_the_names_it_kept_and_the_callers_results_stay() -> None:
    with open_queue(1) as q:
        no_trim(q)
        first = q.push_and_wait(Job("a", jobs_arrays.full, args=(BIG, 3.0)), timeout=WAIT)
        assert q.forget("a")
        second = q.push_and_wait(Job("b", jobs_arrays.full, args=(BIG, 4.0)), timeout=WAIT)
        pid = q.push_and_wait(Job("pid", jobs.getpid), timeout=WAIT)
        theirs = f"{segment_prefix()}w{pid}-"
        assert [name for name in result_segments() if name.startswith(theirs)]
        os.kill(pid, signal.SIGKILL)
        # The next job runs on the worker that replaced it, once the dead one is reaped.
        assert q.push_and_wait(Job("next", jobs.getpid), timeout=WAIT) != pid
        assert not [name for name in result_segments() if name.startswith(theirs)]
        assert np.array_equal(first, np.full(BIG, 3.0)) and np.array_equal(second, np.full(BIG, 4.0))
        assert q.forget("b")
        del first, second
        gc.collect()
        assert jobs_arrays.mapped_ranges() == []
    assert segments() == []


def test_a_large_argument_counts_towards_the_memory_limit_of_the_job_that_reads_it() -> None:
    # A lane's memory_limit counts the pages of an argument's segment the job
    # has read (docs/lanes.md): read all of a 96 MiB array under 64 MiB, and
    # the supervisor's memory watch ends the job; read one value, and it does not.
    array = np.ones(96 << 17)  # 96 MiB
    with open_queue({"m": Lane(workers=1, memory_limit="64M")}) as q:
        with pytest.raises(JobFailed) as info:
            q.push_and_wait(Job("all", jobs_arrays.read_then_linger, args=(array, True, 10.0), lane="m"), timeout=WAIT)
        assert info.value.failure.kind == "memory"
        job = Job("one", jobs_arrays.read_then_linger, args=(array, False, 0.5), lane="m")
        assert q.push_and_wait(job, timeout=WAIT) == "lingered"
    assert segments() == []


def test_a_worker_running_jobs_with_a_memory_limit_keeps_its_result_segments_unmapped() -> None:
    with open_queue({"m": Lane(workers=1, memory_limit="1G")}) as q:
        no_trim(q, "m")
        names: set[str] = set()
        for i in range(3):
            out = q.push_and_wait(Job(f"r{i}", jobs_arrays.full, args=(BIG, float(i)), lane="m"), timeout=WAIT)
            assert np.array_equal(out, np.full(BIG, float(i)))
            names.update(result_segments())
            assert q.forget(f"r{i}")
            del out
            gc.collect()
        assert len(names) == 1  # written again all the same, through its file
        assert q.push_and_wait(Job("mapped", jobs_arrays.result_segments_mapped, lane="m"), timeout=WAIT) == 0
    assert segments() == []


def test_results_sent_faster_than_they_are_read_are_all_read_and_none_left() -> None:
    # Each worker sends results faster than the caller lets go of them: it
    # drops segments the supervisor still has (or has yet to read) from its
    # keep, and the supervisor removes their names as it lets go.
    with open_queue(2) as q:
        handles = [q.push(Job(f"m{i}", jobs_arrays.full, args=(BIG, float(i)))).handle for i in range(40)]
        outs = [handle.result(timeout=WAIT) for handle in handles]
        for i, out in enumerate(outs):
            assert np.array_equal(out, np.full(BIG, float(i)))
        for i in range(40):
            assert q.forget(f"m{i}")
        del handles, outs, out
        gc.collect()
        assert jobs_arrays.mapped_ranges() == []
        assert len(result_segments()) <= 2 * KEEP_RESULT_SEGMENTS  # each worker's keep
    assert segments() == []


def test_a_segment_dropped_from_the_keep_before_its_message_is_read() -> None:
    segments_ = ResultSegments(segment_prefix())
    buffer = [pickle.PickleBuffer(np.full(BIG, 1.0))]
    sent = [segments_.write(buffer) for _ in range(KEEP_RESULT_SEGMENTS + 1)]
    first, *rest = sent
    assert first[0] not in [name for name, _, _ in rest] and first[0] in segments()  # dropped, its name left
    views = map_result(*first)  # the supervisor reads its message late: still there, its name goes now
    assert first[0] not in segments()
    assert np.array_equal(np.frombuffer(views[0], dtype=np.float64), np.full(BIG, 1.0))
    for name, spans, token in rest:
        for view in map_result(name, spans, token):
            view.release()
    del views
    gc.collect()
    # The kept ones are free again: the next result goes into one of them.
    assert segments_.write(buffer)[0] in [name for name, _, _ in rest]
    for name in segments():
        os.unlink(os.path.join(SHM_DIR, name))


def test_an_idle_worker_lets_go_of_the_result_segments_it_kept() -> None:
    with open_queue(1) as q:
        q.push_and_wait(Job("soon", jobs_arrays.trim_after, args=(50,)), timeout=WAIT)
        held = q.push_and_wait(Job("held", jobs_arrays.full, args=(BIG, 1.0)), timeout=WAIT)
        out = q.push_and_wait(Job("let go", jobs_arrays.full, args=(BIG, 2.0)), timeout=WAIT)
        assert q.forget("let go")
        del out
        gc.collect()
        # Idle, the worker drops both: the free one's name at once, the held one's as the caller lets go.
        wait_until(lambda: len(result_segments()) == 1, what="the free segment's name removed")
        assert np.array_equal(held, np.ones(BIG))
        assert q.forget("held")
        del held
        gc.collect()
        assert result_segments() == [] and jobs_arrays.mapped_ranges() == []
        # And the next large result makes a new one.
        assert np.array_equal(
            q.push_and_wait(Job("again", jobs_arrays.full, args=(BIG, 3.0)), timeout=WAIT), np.full(BIG, 3.0)
        )
    assert segments() == []
