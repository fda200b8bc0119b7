"""Job control: timeouts, SIGTERM and its grace, process trees, cancel, memory
limits, worker recycling, lane settings (rlimits, env, cwd) and inherited descriptors.

Every wait is on a handle, a FIFO or a file written atomically, and bounded.
A job that must be killed blocks on a pipe nobody writes to; how long anything
took is never asserted (the kill latency is measured in bench/).
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import signal
import threading
from typing import Any

import jobs
import jobs_control
import jobs_core
import jobs_crashes
import pytest
from core_support import (
    BlockingCall,
    Gates,
    OnPickle,
    assert_all_gone,
    failure_of,
    hold,
    open_queue,
    wait_started,
)
from process_support import children, linux_only, subreaper

from procq import (
    Completed,
    Failed,
    InFlight,
    Job,
    JobFailed,
    Lane,
    Pending,
    Processing,
    Queued,
)

pytestmark = pytest.mark.skipif(not linux_only, reason="job control relies on Linux process groups and /proc")

WAIT = 20.0
MIB = 1 << 20


# --- helpers -----------------------------------------------------------------------


def read(path: Any) -> str:
    with open(path) as f:
        return f.read()


# --- Timeouts ------------------------------------------------------------------------


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
    with open_queue({"grace": Lane(timeout=0.3), "nograce": Lane(timeout=0.3, kill_grace=0)}, start_method=start_method) as q:
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
            handle = q.push(Job(f"stubborn-{attempt}", jobs_control.ignore_sigterm_then_block, args=(ready,), timeout=limit)).handle
            failure = failure_of(handle, "timeout", timeout=limit + WAIT)
            if os.path.exists(ready):
                break
        else:
            pytest.fail("the job never got as far as ignoring SIGTERM")
        assert int(read(ready)) == failure.pid
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
        assert read(cleaned) == f"cleaned up {pid}"
        assert q.push_and_wait(Job("after", jobs.square, args=(6,)), timeout=WAIT) == 36


# --- Process trees ---------------------------------------------------------------------


@pytest.mark.parametrize("how", ["timeout", "cancel", "memory", "crash"])
def test_no_descendant_survives_a_killed_job(start_method: str, tmp_path: Any, how: str, gates: Gates) -> None:
    """The job starts a child in its worker's process group and one in a
    session of its own (for ``memory``, also a child that eats memory); when
    the job is killed, all of them go. When the worker itself dies (``crash``,
    SIGKILL from outside), its process group goes with it."""
    gate = jobs.fifo(tmp_path, "gate")  # never released
    with subreaper(), open_queue({"t": 1, "other": 1}, start_method=start_method) as q:
        other, other_pid, other_go = hold(q, gates, "other", lane="other")
        before = q.stats().lanes["t"]
        if how == "timeout":
            # The job must report its pids before its time runs out (see above).
            for attempt, limit in enumerate((0.5, 4.0, 16.0)):
                report = str(tmp_path / f"pids-{attempt}")
                handle = q.push(Job(f"tree-{attempt}", jobs_control.tree_then_block, args=(gate, report), lane="t", timeout=limit)).handle
                failure = failure_of(handle, "timeout", timeout=limit + WAIT)
                if os.path.exists(report):
                    break
            else:
                pytest.fail("the job never got as far as starting its children")
            pids = [int(p) for p in read(report).split()]
        elif how == "memory":
            report = str(tmp_path / "pids")
            job = Job("tree", jobs_control.tree_then_hog, args=(gate, report, 1024), lane="t", memory_limit="64M", timeout=30)
            failure = failure_of(q.push(job).handle, "memory")
            pids = [int(p) for p in read(report).split()]
            assert len(pids) == 4
            assert re.fullmatch(
                r"job 'tree' went over its memory_limit of 64 MiB \(its process tree held [\d.]+ [KMG]iB( \(\d+ bytes\))? more "
                rf"than the idle worker\); its worker \(pid {pids[0]}\) and that process's tree were killed",
                failure.message,
            ), failure.message
        else:
            started = jobs.fifo(tmp_path, "started")
            own_session = how == "cancel"
            handle = q.push(Job("tree", jobs_control.tree_then_block, args=(gate, None, started, own_session), lane="t")).handle
            pids = [int(p) for p in wait_started(handle, started).split()]
            assert len(pids) == (3 if own_session else 2)
            if how == "cancel":
                assert q.cancel("tree") is True
                failure = failure_of(handle, "cancelled")
                assert failure.message == "job 'tree' was cancelled by q.cancel() while it ran; its worker's process tree was killed"
            else:
                os.kill(pids[0], signal.SIGKILL)
                failure = failure_of(handle, "crashed")
                assert (failure.signal, failure.exitcode) == ("SIGKILL", -9)
        worker_pid, descendants = pids[0], pids[1:]
        assert failure.pid == worker_pid
        assert worker_pid not in q._worker_pids() and worker_pid not in children()
        assert_all_gone(descendants)

        lane = q.stats().lanes["t"]
        assert lane.crashes == before.crashes + (how == "crash")
        assert (lane.workers_alive, lane.running, lane.waiting) == (1, 0, 0)
        assert q.push_and_wait(Job("after", jobs.getpid, lane="t"), timeout=WAIT) not in pids
        # The job on the other lane never noticed.
        assert q.state("other") == Processing()
        other_go.open()
        assert other.result(timeout=WAIT) == other_pid


# --- Cancel ---------------------------------------------------------------------------


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
    import procq._dispatch

    monkeypatch.setattr(procq._dispatch, "PIPELINE_WINDOW", 60.0)  # every job counts as short
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
            except BaseException as exc:  # noqa: BLE001 - checked below
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


# --- Memory -----------------------------------------------------------------------------


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
        assert q.push_and_wait(Job("greedy", jobs_control.allocate, args=(16,), memory_limit=own), timeout=WAIT) == 16 * MIB
        # A job's own limit beats its lane's: here a larger one.
        assert q.push_and_wait(Job("roomy", jobs_control.allocate, args=(200,), memory_limit="1G"), timeout=WAIT) == 200 * MIB


def test_a_memory_limit_ends_with_its_job(start_method: str) -> None:
    """The address-space limit is set around one job: the worker's next job,
    with no limit, may use more."""
    with open_queue({"m": Lane(workers=1)}, start_method=start_method) as q:
        pid = q.push_and_wait(Job("pid", jobs.getpid), timeout=WAIT)
        assert q.push_and_wait(Job("limited", jobs_control.allocate, args=(16,), memory_limit="64M"), timeout=WAIT) == 16 * MIB
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


# --- Worker recycling ---------------------------------------------------------------------


def test_max_jobs_per_worker_replaces_the_worker_every_n_jobs(start_method: str) -> None:
    with open_queue({"r": Lane(workers=1, max_jobs_per_worker=2)}, start_method=start_method) as q:
        handles = [q.push(Job(f"j{i}", jobs.getpid)).handle for i in range(6)]
        pids = [h.result(timeout=WAIT) for h in handles]
        assert pids[0::2] == pids[1::2], pids  # two jobs per worker
        assert len(set(pids)) == 3, pids
        lane = q.stats().lanes["r"]
        assert (lane.completed, lane.failed, lane.crashes, lane.worker_restarts) == (6, 0, 0, 3)
        assert not set(pids) & set(q._worker_pids())
        assert q.push_and_wait(Job("next", jobs.getpid), timeout=WAIT) not in pids


def test_max_worker_rss_replaces_a_worker_that_grew(start_method: str) -> None:
    with open_queue({"r": Lane(workers=1, max_worker_rss="200M")}, start_method=start_method) as q:
        first = q.push_and_wait(Job("small-1", jobs.getpid), timeout=WAIT)
        assert q.push_and_wait(Job("small-2", jobs.getpid), timeout=WAIT) == first  # small: kept
        assert q.push_and_wait(Job("hoard", jobs_control.hoard, args=(300,)), timeout=WAIT) == first
        replacement = q.push_and_wait(Job("small-3", jobs.getpid), timeout=WAIT)
        assert replacement != first
        lane = q.stats().lanes["r"]
        assert (lane.completed, lane.failed, lane.crashes, lane.worker_restarts) == (4, 0, 0, 1)


# --- Argument checks -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rlimits", "error", "match"),
    [
        ({"stack": 10}, ValueError, r"^unknown rlimit 'stack'; procq sets 'cpu', 'fsize', 'nofile', 'nproc'$"),
        ({"cpu": 0}, ValueError, r"^rlimit 'cpu' must be an int of at least 1 \(seconds of CPU time per job\), got 0$"),
        ({"nofile": "64"}, ValueError, r"^rlimit 'nofile' must be an int of at least 1 \(open file descriptors\), got '64'$"),
        ({"nproc": True}, ValueError, r"^rlimit 'nproc' must be an int of at least 1 .*, got True$"),
        ({"nproc": -3}, ValueError, r"^rlimit 'nproc' must be an int of at least 1 .*, got -3$"),
        ({"fsize": "lots"}, ValueError, r"^rlimit 'fsize' must be a number of bytes or a string such as '512M' or '2G', got 'lots'$"),
        ({"fsize": 0}, ValueError, r"^rlimit 'fsize' must be at least 1 byte, got 0$"),
        ({"fsize": 1.5}, TypeError, r"^rlimit 'fsize' must be a number of bytes or a string such as '512M', got float$"),
        ([("cpu", 1)], TypeError, r"^lane rlimits must be a mapping such as \{'cpu': 10\}, got list$"),
    ],
)
def test_bad_rlimits_are_refused(rlimits: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Lane(rlimits=rlimits)


def test_rlimits_are_normalized() -> None:
    lane = Lane(rlimits={"cpu": 5, "fsize": "1M", "nofile": 64, "nproc": 100})
    assert lane.rlimits == {"cpu": 5, "fsize": MIB, "nofile": 64, "nproc": 100}


@pytest.mark.parametrize(
    ("size", "expected"),
    [(1, 1), (4096, 4096), ("512M", 512 * MIB), ("2G", 2 << 30), ("1.5GiB", 3 << 29), ("64k", 64 << 10), (" 3 MB ", 3 * MIB), ("100", 100)],
)
def test_sizes(size: Any, expected: int) -> None:
    assert Job("k", jobs.square, memory_limit=size).memory_limit == expected
    lane = Lane(memory_limit=size, max_worker_rss=size, max_result_bytes=size)
    assert (lane.memory_limit, lane.max_worker_rss, lane.max_result_bytes) == (expected, expected, expected)


_NOT_A_SIZE = r"must be a number of bytes or a string such as '512M' or '2G', got "


@pytest.mark.parametrize(
    ("size", "error", "match"),
    [
        ("lots", ValueError, _NOT_A_SIZE + r"'lots'$"),
        ("2X", ValueError, _NOT_A_SIZE + r"'2X'$"),
        ("-1M", ValueError, _NOT_A_SIZE + r"'-1M'$"),
        ("", ValueError, _NOT_A_SIZE + r"''$"),
        (-1, ValueError, r"must be at least 1 byte, got -1$"),
        (0, ValueError, r"must be at least 1 byte, got 0$"),
        ("0M", ValueError, r"must be at least 1 byte, got '0M'$"),
        (1.5, TypeError, r"must be a number of bytes or a string such as '512M', got float$"),
        (True, TypeError, r"must be a number of bytes or a string such as '512M', got bool$"),
    ],
)
def test_bad_sizes_are_refused(size: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=r"^job 'k': memory_limit " + match):
        Job("k", jobs.square, memory_limit=size)
    for name in ("memory_limit", "max_worker_rss", "max_result_bytes"):
        with pytest.raises(error, match=rf"^lane {name} " + match):
            Lane(**{name: size})


@pytest.mark.parametrize(
    ("timeout", "error", "match"),
    [
        (0, ValueError, r"must be a positive number of seconds, got 0$"),
        (-1.5, ValueError, r"must be a positive number of seconds, got -1\.5$"),
        (float("nan"), ValueError, r"must be a positive number of seconds, got nan$"),
        (float("inf"), ValueError, r"must be a positive number of seconds, got inf$"),
        ("1", TypeError, r"must be a number of seconds or None, got str$"),
        (True, TypeError, r"must be a number of seconds or None, got bool$"),
    ],
)
def test_bad_timeouts_are_refused(timeout: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=r"^job 'k': timeout " + match):
        Job("k", jobs.square, timeout=timeout)
    with pytest.raises(error, match=r"^lane timeout " + match):
        Lane(timeout=timeout)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"max_jobs_per_worker": 0}, ValueError, r"^lane max_jobs_per_worker must be an int of at least 1 or None, got 0$"),
        ({"max_jobs_per_worker": 2.0}, ValueError, r"^lane max_jobs_per_worker must be an int of at least 1 or None, got 2\.0$"),
        ({"kill_grace": -1}, ValueError, r"^lane kill_grace must be a number of seconds >= 0, got -1$"),
        ({"kill_grace": float("inf")}, ValueError, r"^lane kill_grace must be a number of seconds >= 0, got inf$"),
        ({"trusted": "no"}, TypeError, r"^lane trusted must be a bool, got str$"),
        ({"inherit_env": 1}, TypeError, r"^lane inherit_env must be a bool or None, got int$"),
        ({"env": {"A": 1}}, TypeError, r"^lane env must map str to str, got 'A': 1$"),
        ({"env": ["A=1"]}, TypeError, r"^lane env must be a mapping of str to str, got list$"),
        ({"cwd": "/no/such/directory"}, ValueError, r"^lane cwd '/no/such/directory' is not a directory$"),
        ({"cwd": 3}, TypeError, r"^lane cwd must be a path, got int$"),
    ],
)
def test_bad_lane_settings_are_refused(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Lane(**kwargs)


def test_lane_defaults_depend_on_trust() -> None:
    trusted, untrusted = Lane(), Lane(trusted=False)
    assert (trusted.max_result_bytes, trusted.inherit_env, trusted.kill_grace) == (None, True, 0.05)
    assert (untrusted.max_result_bytes, untrusted.inherit_env) == (16 * MIB, False)
    assert Lane(trusted=False, inherit_env=True, max_result_bytes="1K").max_result_bytes == 1024


# --- Environment, working directory, descriptors ----------------------------------------------




@pytest.mark.parametrize(
    ("method", "trusted"),
    [
        pytest.param("forkserver", True, id="forkserver-trusted"),
        pytest.param("spawn", True, id="spawn-trusted"),
        pytest.param(None, False, id="untrusted"),
    ],
)
def test_env_and_cwd(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, method: str | None, trusted: bool) -> None:
    # Start the forkserver (if it is not yet running) before the variable
    # below is set: workers must see the supervisor's environment as it is now.
    with open_queue(1, start_method=method) as q:
        q.push_and_wait(Job("warm", jobs.square, args=(1,)), timeout=WAIT)
    monkeypatch.setenv("PROCQ_TEST_SUPERVISOR_VAR", "from-the-supervisor")
    given = {"PROCQ_TEST_GIVEN": "given", "PROCQ_TEST_SUPERVISOR_VAR": "overridden-by-the-lane"}
    lanes = {
        "default": Lane(trusted=trusted),
        "given": Lane(trusted=trusted, env=given, cwd=tmp_path),
        "clean": Lane(trusted=trusted, env={"ONLY": "this"}, inherit_env=False),
        "inherit": Lane(trusted=trusted, env={"ALSO": "this"}, inherit_env=True),
    }
    with open_queue(lanes, start_method=method) as q:

        def env(lane: str) -> dict[str, str]:
            return q.push_and_wait(Job(f"env-{lane}", jobs_control.environ, lane=lane), timeout=WAIT)  # type: ignore[no-any-return]

        # Only the lane's own variables, or the supervisor's (PATH, HOME, ...) too.
        assert env("clean") == {"ONLY": "this"}
        inherited = env("inherit")
        assert inherited["ALSO"] == "this"
        for name in ("PATH", "HOME", "PROCQ_TEST_SUPERVISOR_VAR"):
            assert inherited.get(name) == os.environ.get(name), name
        given_env = env("given")
        assert given_env["PROCQ_TEST_GIVEN"] == "given"
        assert given_env["PROCQ_TEST_SUPERVISOR_VAR"] == "overridden-by-the-lane"
        # By default a trusted lane inherits the supervisor's environment, an untrusted one does not.
        default = env("default")
        if trusted:
            assert given_env.get("PATH") == default.get("PATH") == os.environ.get("PATH")
            assert default.get("PROCQ_TEST_SUPERVISOR_VAR") == "from-the-supervisor"
        else:
            assert default == {}
            assert given_env == given

        assert q.push_and_wait(Job("cwd", jobs_control.getcwd, lane="given"), timeout=WAIT) == str(tmp_path)
        assert q.push_and_wait(Job("cwd-default", jobs_control.getcwd, lane="default"), timeout=WAIT) == os.getcwd()


@pytest.mark.parametrize(
    ("method", "trusted", "nofile"),
    [
        ("forkserver", True, None),
        ("spawn", True, None),
        (None, False, None),
        # A tight descriptor limit must not stop the worker from closing what it inherited.
        ("forkserver", True, 5),
        ("spawn", True, 5),
        (None, False, 5),
    ],
    ids=["forkserver-trusted", "spawn-trusted", "untrusted", "forkserver-nofile", "spawn-nofile", "untrusted-nofile"],
)
def test_a_worker_inherits_no_descriptor_but_its_pipes(
    tmp_path: Any, method: str | None, trusted: bool, nofile: int | None, gates: Gates
) -> None:
    """The worker holds stdio, its own pipe (a socket) and one pipe that tells
    it the supervisor died: nothing the supervisor had open, not even a file
    it made inheritable, and not another worker's pipe."""
    secret = tmp_path / "secret"
    fd = os.open(secret, os.O_CREAT | os.O_RDWR, 0o600)
    os.set_inheritable(fd, True)
    try:
        rlimits = None if nofile is None else {"nofile": nofile}
        with open_queue({"t": Lane(workers=2, trusted=trusted, rlimits=rlimits)}, start_method=method) as q:
            first, _, go = hold(q, gates, "busy")  # so the next job runs on the other worker
            fds = q.push_and_wait(Job("fds", jobs_control.open_fds), timeout=WAIT)
            go.open()
            first.result(timeout=WAIT)
    finally:
        os.close(fd)
    fds = {int(k): v for k, v in fds.items()}
    assert str(secret) not in fds.values(), fds
    extra = {k: v for k, v in fds.items() if k > 2}
    assert len(extra) <= 2, fds
    # Its pipe to the supervisor is its only socket; the other is a pipe (the supervisor's liveness).
    assert sorted(v.split(":")[0] for v in extra.values()) in (["socket"], ["pipe", "socket"]), fds


def test_a_worker_that_dies_with_jobs_sent_ahead_fails_only_the_one_it_ran(
    tmp_path: Any, gates: Gates, monkeypatch: pytest.MonkeyPatch, start_method: str
) -> None:
    """Jobs sent ahead to a worker that then dies were never started: they go
    back to their lane and run once, on its replacement. Only the job the
    worker was running fails."""
    import procq._dispatch

    monkeypatch.setattr(procq._dispatch, "PIPELINE_WINDOW", 60.0)  # every job counts as short
    requeued: list[list[str]] = []
    requeue = procq._dispatch.Dispatch.requeue

    def spy(self: Any, worker: Any, now: float, wakeups: Any) -> None:
        if worker.queue:  # (every worker's death passes here; most hold nothing ahead)
            requeued.append([e.key for e in worker.queue])
        requeue(self, worker, now, wakeups)

    monkeypatch.setattr(procq._dispatch.Dispatch, "requeue", spy)
    log = str(tmp_path / "log")
    gate = gates("first")
    with open_queue({"one": Lane(workers=1)}, start_method=start_method) as q:
        core_lane = q._core.lanes["one"]
        assert q.push_and_wait(Job("warm", jobs.getpid, lane="one"), timeout=WAIT) > 0
        first = q.push(Job("first", jobs.signal_and_wait, args=(gate.started, gate.go), lane="one")).handle
        gate.wait_started()
        killer = q.push(Job("killer", jobs.sigkill_self, lane="one")).handle
        after = [q.push(Job(f"after:{i}", jobs_core.record, args=(log, f"after:{i}"), lane="one")).handle for i in range(3)]
        gate.open()  # first ends; the worker is given killer, and the rest behind it
        failure = failure_of(killer, "crashed")
        assert failure.signal == "SIGKILL"
        assert first.result(timeout=WAIT) > 0
        pids = {h.result(timeout=WAIT) for h in after}
        assert failure.pid not in pids  # they ran on the replacement
        with open(log) as f:
            assert sorted(line.split()[0] for line in f) == ["after:0", "after:1", "after:2"]  # once each
        stats = q.stats().lanes["one"]
        assert (stats.crashes, stats.failed, core_lane.prefetched) == (1, 1, 0)
    # The dead worker held the three behind the job it ran: they went back to the lane.
    assert requeued == [["after:0", "after:1", "after:2"]]
