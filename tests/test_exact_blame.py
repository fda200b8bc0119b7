"""Exact blame: a job fails for its worker's death only if it had started in
that worker. A job given to a worker that was already dead (killed while idle,
from outside, before it read the job) runs on another worker, once; a job
running when its worker is killed still fails "crashed" with the signal.

The real-process tests kill workers from outside, as the OOM killer or an
operator would, in trusted, untrusted and sandboxed lanes. To give a job to
a worker that cannot start it without racing the supervisor, a worker is
first stopped (SIGSTOP: from then on it starts nothing), a job is pushed and
given to it, and only then is it killed. The orders of events a real queue
meets only by chance are driven on the I/O-free core (``Core``) directly.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import jobs
import jobs_core
import pytest
from core_support import WAIT, Gates, failure_of, hold, open_queue, read_log, wait_until

import procq._core.dispatch
from procq import Completed, Failed, Failure, Job, Lane, Pending, Processing, ProcQueue, Queued, Sandbox
from procq._core.core import Core
from procq._core.dispatch import UNSTARTED_DEATHS_TO_FAIL
from procq._core.entries import Entry, LaneState, WorkerSlot
from procq._wire.startmark import Unstarted

KINDS = ["trusted", "untrusted", "sandboxed"]


def _lane(kind: str, workers: int, tmp_path: Path) -> Lane:
    if kind == "trusted":
        return Lane(workers=workers)
    if kind == "untrusted":
        return Lane(workers=workers, trusted=False)
    if not sys.platform.startswith("linux"):
        pytest.skip("sandboxes are Linux's")
    return Lane(workers=workers, trusted=False, sandbox=Sandbox(write=(str(tmp_path),)))


def _ready_pids(q: ProcQueue, workers: int) -> list[int]:
    """The lane's workers, once it has all of them (a replacement may still be starting)."""
    wait_until(lambda: len(q._worker_pids()) == workers, what=f"{workers} workers alive")
    return q._worker_pids()


def _runs(log: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in read_log(log):
        tag = line.split()[0]
        counts[tag] = counts.get(tag, 0) + 1
    return counts


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_a_job_given_to_a_worker_dead_before_it_ran_runs_once_elsewhere(
    kind: str, workers: int, tmp_path: Path
) -> None:
    log = tmp_path / "runs"
    with open_queue({"a": _lane(kind, workers, tmp_path)}) as q:
        for r in range(4):
            # Warm: each worker has run a job, then waits for the next.
            for i in range(workers):
                assert q.push_and_wait(Job(f"warm:{r}:{i}", jobs_core.record, args=(str(log), f"warm:{r}:{i}")))
            pids = _ready_pids(q, workers)
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)  # it starts nothing from now on
            outcome = q.push(Job(f"k{r}", jobs_core.record, args=(str(log), f"k{r}")))
            assert isinstance(outcome, Queued)
            wait_until(lambda r=r: q.state(f"k{r}") == Processing(), what="the job given to a stopped worker")
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            ran_in = outcome.handle.result(timeout=WAIT)  # never failed: it had not started
            assert ran_in not in pids
            assert q.state(f"k{r}") == Completed(ran_in)
        stats = q.stats().lanes["a"]
        assert (stats.failed, stats.crashes) == (0, 0)
        assert stats.completed == 4 * workers + 4
    runs = _runs(log)
    assert [runs.get(f"k{r}") for r in range(4)] == [1, 1, 1, 1]  # each ran exactly once


@pytest.mark.parametrize("kind", KINDS)
def test_a_job_pushed_right_after_its_worker_is_killed_idle_does_not_fail(kind: str, tmp_path: Path) -> None:
    """Killed, then a push at once: the supervisor may not have seen the death
    yet, and give the job to the dead worker. No job fails, each runs once."""
    log = tmp_path / "runs"
    with open_queue({"a": _lane(kind, 1, tmp_path)}) as q:
        for r in range(15):
            [pid] = _ready_pids(q, 1)
            q.push_and_wait(Job(f"warm:{r}", jobs.getpid), timeout=WAIT)
            os.kill(pid, signal.SIGKILL)
            assert q.push_and_wait(Job(f"k{r}", jobs_core.record, args=(str(log), f"k{r}")), timeout=WAIT) != pid
        assert q.stats().lanes["a"].failed == 0
    runs = _runs(log)
    assert all(runs.get(f"k{r}") == 1 for r in range(15)), runs


@pytest.mark.parametrize("kind", KINDS)
def test_a_job_running_when_its_worker_is_killed_fails_crashed(kind: str, tmp_path: Path, gates: Gates) -> None:
    with open_queue({"a": _lane(kind, 1, tmp_path)}) as q:
        q.push_and_wait(Job("warm", jobs.getpid), timeout=WAIT)
        [pid] = _ready_pids(q, 1)
        handle, _, gate = hold(q, gates, "running")
        os.kill(pid, signal.SIGKILL)
        failure = failure_of(handle, "crashed")
        assert failure.signal == "SIGKILL" and failure.pid == pid
        assert "while running job 'running'" in failure.message
        gate.open()
        assert q.push_and_wait(Job("next", jobs.getpid), timeout=WAIT) != pid  # the lane goes on


def test_jobs_sent_ahead_of_a_killed_workers_job_run_once(
    tmp_path: Path, gates: Gates, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The running job fails with the signal; the jobs sent ahead behind it
    (in the same frame the worker had read) never started: each runs once."""
    monkeypatch.setattr(procq._core.dispatch, "PIPELINE_WINDOW", 60.0)  # every job counts as short
    log = tmp_path / "runs"
    with open_queue({"a": Lane(workers=1)}) as q:
        q.push_and_wait(Job("warm", jobs.getpid), timeout=WAIT)  # (a service time: jobs go ahead)
        first, pid, first_gate = hold(q, gates, "first")
        second_gate = gates("running")
        running = q.push(Job("running", jobs.signal_and_wait, args=(second_gate.started, second_gate.go))).handle
        behind = [q.push(Job(f"b{i}", jobs_core.record, args=(str(log), f"b{i}"))) for i in range(5)]
        first_gate.open()  # first ends; the worker is given "running", and the rest behind it
        assert first.result(timeout=WAIT) == pid
        second_gate.wait_started()
        assert q._core.lanes["a"].prefetched == 5
        os.kill(pid, signal.SIGKILL)
        failure = failure_of(running, "crashed")
        assert failure.signal == "SIGKILL" and "while running job 'running'" in failure.message
        second_gate.open()
        for outcome in behind:
            assert isinstance(outcome, Queued)
            assert outcome.handle.result(timeout=WAIT) != pid
    assert _runs(log) == {f"b{i}": 1 for i in range(5)}


def test_a_death_before_the_job_started_is_counted_logged_and_shown_as_a_workers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="procq")
    with open_queue({"a": Lane(workers=1)}) as q:
        pid = q.push_and_wait(Job("warm", jobs.getpid), timeout=WAIT)  # (ready: it has run a job)
        os.kill(pid, signal.SIGSTOP)
        outcome = q.push(Job("innocent", jobs.getpid))
        assert isinstance(outcome, Queued)
        wait_until(lambda: q.state("innocent") == Processing(), what="the job given to the stopped worker")
        os.kill(pid, signal.SIGKILL)
        assert outcome.handle.result(timeout=WAIT) != pid
        metrics = q.metrics()
    lane = metrics.lanes["a"]
    assert lane.worker_deaths == {"crashed:SIGKILL": 1}  # a worker's death, with no job of its own
    assert sum(lane.failed.values()) == 0 and lane.started == 2  # "innocent" started once: on its new worker
    [event] = metrics.failures
    assert (event.key, event.lane, event.kind) == ("", "a", "worker")
    assert event.message == (
        f"worker process {pid} was killed by SIGKILL before it started job 'innocent' "
        "(not the job's fault: it goes to another worker)"
    )
    [line] = [r.getMessage() for r in caplog.records if r.name == "procq.worker" and r.levelno == logging.WARNING]
    assert f"worker {pid} (lane 'a') was killed by SIGKILL" in line
    assert "before it started job 'innocent', which was not the cause and goes to another worker" in line


def test_a_worker_killed_idle_is_a_worker_event_among_the_last_failures(tmp_path: Path) -> None:
    with open_queue({"a": Lane(workers=1)}) as q:
        pid = q.push_and_wait(Job("first", jobs.getpid), timeout=WAIT)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: q.metrics().failures, what="the death to be seen")
        [event] = q.metrics().failures
        assert (event.key, event.kind) == ("", "worker")
        assert event.message == f"worker process {pid} was killed by SIGKILL while idle"
        assert q.stats().lanes["a"].failed == 0


# --- on the core: the orders of events a real queue meets by chance ----------------------------


class _Channel:
    pid = None


def _core(workers: int = 1) -> tuple[Core, LaneState, list[WorkerSlot]]:
    core = Core({"l": Lane(workers=workers)}, check_payload=False, strict_payload=False)
    lane = core.lanes["l"]
    slots = []
    for _ in range(workers):
        worker = WorkerSlot(lane, _Channel())
        core.add_worker(worker, lane, reserved=False)
        assert core.worker_ready(worker) is None
        slots.append(worker)
    return core, lane, slots


def _crash(entry: Entry, started: bool) -> Failure:
    return Failure("crashed", f"{entry.key} {'crashed' if started else 'never started'}")


def _push(core: Core, key: str) -> tuple[Entry, Any]:
    kind, entry, _ = core.claim(Job(key, jobs.getpid), core.lanes["l"])
    assert kind == "queued"
    return entry, core.offer(entry)


def _die(core: Core, worker: WorkerSlot, last_started: int | None) -> None:
    _, wakeups = core.worker_died(worker, _crash, -9, "SIGKILL", last_started=last_started)
    for wake in wakeups:
        wake()


def test_core_a_job_its_dead_worker_never_started_is_pending_again_with_no_attempt_counted() -> None:
    core, lane, [worker] = _core()
    entry, offered = _push(core, "k")
    assert offered is worker
    core.sent(worker)
    assert core.state("k") == Processing()
    _die(core, worker, last_started=0)  # the worker had started no job
    assert core.state("k") == Pending()  # not Pending(attempt=2): no attempt was counted
    assert list(lane.ready) == [entry] and entry.worker is None and entry.pid is None
    assert lane.tally.started == 0 and lane.crashes == 0 and lane.retries == 0
    assert dict(lane.tally.deaths) == {("crashed", "SIGKILL"): 1}
    core._check_invariants()
    # A new worker takes it, and it completes as if nothing had happened.
    fresh = WorkerSlot(lane, _Channel())
    core.add_worker(fresh, lane, reserved=False)
    assert core.worker_ready(fresh) is entry
    core.sent(fresh)
    core.jobs_done(fresh, [(entry.job_id, Completed(1), False, False)])
    assert core.state("k") == Completed(1) and lane.tally.started == 1
    core._check_invariants()


def test_core_a_job_its_worker_started_fails_as_before() -> None:
    core, _, [worker] = _core()
    entry, _ = _push(core, "k")
    core.sent(worker)
    _die(core, worker, last_started=entry.job_id)
    state = core.state("k")
    assert isinstance(state, Failed) and state.failure.message == "k crashed"
    core._check_invariants()


def test_core_with_no_word_from_the_worker_the_held_job_is_blamed() -> None:
    core, _, [worker] = _core()
    _push(core, "k")
    core.sent(worker)
    _die(core, worker, last_started=None)  # (a kind of worker that cannot tell)
    state = core.state("k")
    assert isinstance(state, Failed) and state.failure.message == "k crashed"


def test_core_a_job_whose_workers_keep_dying_before_it_starts_fails_after_the_limit() -> None:
    core, lane, [worker] = _core()
    entry, _ = _push(core, "k")
    core.sent(worker)
    for death in range(1, UNSTARTED_DEATHS_TO_FAIL + 1):
        _die(core, worker, last_started=0)
        if death < UNSTARTED_DEATHS_TO_FAIL:
            assert core.state("k") == Pending()
            worker = WorkerSlot(lane, _Channel())
            core.add_worker(worker, lane, reserved=False)
            assert core.worker_ready(worker) is entry  # re-sent to the next worker
            core.sent(worker)
    state = core.state("k")
    assert isinstance(state, Failed) and state.failure.message == "k never started"
    assert entry.attempt == 1 and lane.retries == 0
    core._check_invariants()


def test_core_a_forked_job_process_that_died_before_the_job_started_is_run_again() -> None:
    """An untrusted lane's worker reports its job's process died before the
    job started (``Unstarted``): the same worker runs it again, no attempt
    counted; past the limit, it fails with the failure the report carries."""
    core, lane, [worker] = _core()
    entry, _ = _push(core, "k")
    core.sent(worker)
    given_up = Failed(Failure("crashed", "k: its process kept dying before it started"))
    for report in range(1, UNSTARTED_DEATHS_TO_FAIL + 1):
        batch, status, taken = core.jobs_done(worker, [(entry.job_id, Unstarted(given_up.failure), False, True)])
        assert (status, taken) == ("done", 1)
        if report < UNSTARTED_DEATHS_TO_FAIL:
            assert batch == [entry] and core.state("k") == Processing()  # the same worker runs it again
            core.sent(worker)
    assert core.state("k") == given_up
    assert lane.crashes == 0 and lane.retries == 0 and entry.attempt == 1
    core._check_invariants()


def test_core_jobs_sent_ahead_and_the_unstarted_held_job_keep_their_order() -> None:
    core, lane, [worker] = _core()
    lane.service = 1e-5  # short jobs: sent ahead
    first, _ = _push(core, "a")
    core.sent(worker)
    rest = [_push(core, k)[0] for k in "bcd"]
    batch, _, _ = core.jobs_done(worker, [(first.job_id, Completed(1), False, False)])
    core.sent(worker)
    assert batch == rest  # b runs; c and d are sent ahead
    _die(core, worker, last_started=first.job_id)  # it died before it started b
    assert [core.state(k) for k in "bcd"] == [Pending(), Pending(), Pending()]
    assert list(lane.ready) == rest and lane.prefetched == 0
    core._check_invariants()
