"""Dask lanes on a real cluster (``dask scheduler`` and two ``dask worker``
processes on loopback, see ``dask_cluster``): the push table and its races,
crashes, timeouts and memory limits inside remote jobs (the Dask worker
survives, the lane keeps its concurrency), a Dask worker killed mid-job,
cancel and close reaching the remote processes, and no process left on either
side after close.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import jobs
import jobs_dask
import jobs_grace
import psutil
import pytest
from conftest import _helper_pids
from core_support import WAIT, Gates, open_queue, wait_started
from dask_cluster import Cluster, import_distributed, running_cluster

from procq import Cached, DaskLane, Failed, InFlight, Job, JobFailed, ProcQueue, Queued, Retry

distributed = import_distributed()  # (or the module is skipped)

LANE = "cluster"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("dask")) as c:
        yield c


@pytest.fixture(autouse=True)
def no_leaked_processes(cluster: Cluster) -> Iterator[None]:
    """This module's leak check: no procq process is left on either side
    after a test (the cluster's own processes, a restarted worker among them,
    are not the test's)."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    allowed = cluster.infrastructure() | _helper_pids()  # (and multiprocessing's own helpers)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.pid not in allowed]
    left += [p for p in cluster.procq_processes() if p not in left]
    _, alive = psutil.wait_procs(left, timeout=5)
    alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    assert not alive, f"test left processes: {[(p.pid, p.cmdline()) for p in alive]}"


def dask_queue(cluster: Cluster, workers: int = 2, **kwargs: object) -> contextlib.AbstractContextManager[ProcQueue]:
    lane = DaskLane(cluster.address, workers=workers, **kwargs)  # type: ignore[arg-type]
    return open_queue({"local": 1, LANE: lane})


# --- the push table, on a cluster lane --------------------------------------------


def test_push_table_on_a_cluster_lane(cluster: Cluster, gates: Gates, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    gate = gates("held")
    job = Job("k", jobs_dask.append_and_wait, args=(log, gate.started, gate.go), lane=LANE)
    with dask_queue(cluster) as q:
        first = q.push(job)
        assert isinstance(first, Queued)
        procq_pid = gate.wait_started()
        assert isinstance(q.push(job), InFlight)  # running on the cluster: joined
        gate.open()
        assert first.handle.result(timeout=WAIT) == procq_pid
        assert q.push(job) == Cached(procq_pid)  # completed: its output, nothing ran
        worker_pids = set(cluster.worker_pids().values())
        assert procq_pid not in worker_pids  # it ran in a procq process, not in the Dask worker
        failing = Job("bad", jobs.boom, args=("no",), lane=LANE)
        with pytest.raises(JobFailed) as raised:
            q.push_and_wait(failing, timeout=WAIT)
        failure = raised.value.failure
        assert failure.kind == "error" and failure.exc_type == "ValueError"
        assert "raise ValueError(message)" in (failure.traceback or "")
        assert isinstance(raised.value.__cause__, ValueError)  # the child's exception, as locally
        assert isinstance(q.push(failing), Queued)  # a failed key runs fresh
        stats = q.stats()
        assert set(vars(stats.lanes[LANE])) == set(vars(stats.lanes["local"]))  # the same fields
        assert stats.lanes[LANE].workers == 2 and stats.lanes[LANE].completed == 1
        lane = q.metrics().lanes[LANE]  # counted as a local lane's are
        assert (lane.pushed, lane.joined, lane.cached, lane.completed) == (3, 1, 1, 1)
        assert lane.failed["error"] in (1, 2)  # (the second "bad" may have failed too by now)
        assert [w.pid for w in q.metrics().workers if w.lane == LANE] == [None, None]  # (no local process)
    with open(log) as f:
        assert len(f.readlines()) == 1  # two pushes, one run


def test_racing_pushes_of_one_key_run_it_once(cluster: Cluster, gates: Gates, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    gate = gates("race")
    job = Job("raced", jobs_dask.append_and_wait, args=(log, gate.started, gate.go), lane=LANE)
    answers: list[object] = []
    barrier = threading.Barrier(8)

    def push() -> None:
        barrier.wait(WAIT)
        answers.append(q.push(job))

    with dask_queue(cluster) as q:
        threads = [threading.Thread(target=push) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        gate.wait_started()
        gate.open()
        outputs = {a.handle.result(timeout=WAIT) for a in answers if isinstance(a, (Queued, InFlight))}
    assert sum(isinstance(a, Queued) for a in answers) == 1
    assert len(answers) == 8 and len(outputs) == 1
    with open(log) as f:
        assert len(f.readlines()) == 1


def test_closures_and_many_jobs(cluster: Cluster) -> None:
    offset = 1000
    with dask_queue(cluster, workers=4) as q:
        handles = [q.push(Job(f"n{i}", lambda x: x + offset, args=(i,), lane=LANE)).handle for i in range(40)]
        assert [h.result(timeout=WAIT) for h in handles] == [i + offset for i in range(40)]
        assert q.stats().lanes[LANE].completed == 40


# --- crashes, time and memory limits inside a remote job ---------------------------


CRASHES = [
    ("segfault", jobs.segfault, "crashed", "SIGSEGV", None),
    ("sigkill", jobs.sigkill_self, "crashed", "SIGKILL", None),
    ("exit", jobs.exit_now, "crashed", None, 3),
]


def test_crash_table_inside_remote_jobs(cluster: Cluster, gates: Gates) -> None:
    before = cluster.worker_pids()
    with dask_queue(cluster) as q:
        for name, fn, kind, sig, code in CRASHES:
            with pytest.raises(JobFailed) as raised:
                q.push_and_wait(Job(name, fn, lane=LANE), timeout=WAIT)
            failure = raised.value.failure
            assert failure.kind == kind, failure
            assert failure.signal == sig and (code is None or failure.exitcode == code), failure
            assert "on Dask worker tcp://127.0.0.1:" in failure.message and f"job {name!r}" in failure.message
        assert q.stats().lanes[LANE].crashes == len(CRASHES)
        # The lane keeps its concurrency: both slots hold a job at once.
        held = [gates(f"held{i}") for i in range(2)]
        handles = [
            q.push(Job(f"held{i}", jobs.signal_and_wait, args=(g.started, g.go), lane=LANE)).handle
            for i, g in enumerate(held)
        ]
        for g in held:
            g.wait_started()
        for g in held:
            g.open()
        for h in handles:
            h.result(timeout=WAIT)
    assert cluster.worker_pids() == before  # every Dask worker survived


def test_a_job_given_to_a_remote_process_killed_idle_runs_once_elsewhere(cluster: Cluster, tmp_path: Path) -> None:
    """A Dask worker keeps its procq processes between jobs; one killed while
    idle (from outside) did not start the job it is given next: another
    process runs it, once, and the job does not fail."""
    import jobs_core

    log = tmp_path / "runs"
    with dask_queue(cluster) as q:
        for i in range(4):
            q.push_and_wait(Job(f"warm{i}", jobs.getpid, lane=LANE), timeout=WAIT)
        pooled = cluster.procq_processes()
        assert pooled
        for p in pooled:
            p.kill()
        deadline = time.monotonic() + WAIT
        while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in pooled):
            assert time.monotonic() < deadline, "the pooled processes did not die"
            time.sleep(0.01)
        killed = {p.pid for p in pooled}
        handles = [q.push(Job(f"k{i}", jobs_core.record, args=(str(log), f"k{i}"), lane=LANE)).handle for i in range(4)]
        assert not {h.result(timeout=WAIT) for h in handles} & killed  # none failed; none ran in a dead one
        assert q.stats().lanes[LANE].failed == 0
    with open(log) as f:
        assert sorted(line.split()[0] for line in f) == ["k0", "k1", "k2", "k3"]  # each ran once


def test_timeout_and_memory_limit_inside_a_remote_job(cluster: Cluster) -> None:
    before = cluster.worker_pids()
    with dask_queue(cluster) as q:
        with pytest.raises(JobFailed) as raised:
            q.push_and_wait(Job("slow", jobs.block_forever, lane=LANE, timeout=0.5), timeout=WAIT)
        failure = raised.value.failure
        assert failure.kind == "timeout" and "ran longer than its timeout of 0.5s" in failure.message
        assert "on Dask worker" in failure.message
        with pytest.raises(JobFailed) as raised:
            q.push_and_wait(Job("big", jobs_dask.allocate, args=(400,), lane=LANE, memory_limit="64M"), timeout=WAIT)
        assert raised.value.failure.kind == "memory"
        assert q.push_and_wait(Job("after", jobs.square, args=(5,), lane=LANE), timeout=WAIT) == 25
    assert cluster.worker_pids() == before


# --- a Dask worker lost mid-job ---------------------------------------------------------


@pytest.mark.parametrize("retried", [False, True])
def test_a_dask_worker_killed_mid_job(cluster: Cluster, gates: Gates, tmp_path: Path, retried: bool) -> None:
    gate = gates("lost")
    marker = str(tmp_path / "marker")
    retry = Retry(attempts=2, backoff=0, on=("crashed",)) if retried else None
    with dask_queue(cluster) as q:
        lost = q.push(Job("lost", jobs_dask.block_once, args=(gate.started, marker), lane=LANE, retry=retry)).handle
        other = q.push(Job("other", jobs.square, args=(6,), lane=LANE)).handle
        procq_pid, dask_pid = map(int, jobs.wait_signal(gate.started, WAIT).split())
        address = {pid: a for a, pid in cluster.worker_pids().items()}[dask_pid]
        os.kill(dask_pid, signal.SIGKILL)
        assert other.result(timeout=WAIT) == 36
        if retried:
            assert lost.result(timeout=WAIT) == "second attempt"
            assert q.stats().lanes[LANE].retries == 1
        else:
            with pytest.raises(JobFailed) as raised:
                lost.result(timeout=WAIT)
            failure = raised.value.failure
            assert failure.kind == "crashed" and failure.attempts == 1
            assert f"Dask worker {address} died" in failure.message
            assert isinstance(q.state("lost"), Failed)
        # The lane goes on, on whichever workers are up.
        assert q.push_and_wait(Job("next", jobs.square, args=(7,), lane=LANE), timeout=WAIT) == 49
        psutil.wait_procs([psutil.Process(procq_pid)] if psutil.pid_exists(procq_pid) else [], timeout=WAIT)
        assert not psutil.pid_exists(procq_pid) or psutil.Process(procq_pid).status() == psutil.STATUS_ZOMBIE
    cluster.wait_for_workers(2)  # (its nanny starts it again)


# --- cancel and close reach the remote process ----------------------------------------


def test_cancel_reaches_the_remote_process(cluster: Cluster, gates: Gates) -> None:
    gate = gates("cancelled")
    with dask_queue(cluster) as q:
        handle = q.push(Job("c", jobs_dask.report_then_block, args=(gate.started,), lane=LANE)).handle
        procq_pid, _ = map(int, jobs.wait_signal(gate.started, WAIT).split())
        remote = psutil.Process(procq_pid)
        assert q.cancel("c")
        with pytest.raises(JobFailed) as raised:
            handle.result(timeout=WAIT)
        assert raised.value.failure.kind == "cancelled"
        _, alive = psutil.wait_procs([remote], timeout=WAIT)
        assert not alive  # the remote process was killed (and reaped there)
        assert q.push_and_wait(Job("after", jobs.square, args=(3,), lane=LANE), timeout=WAIT) == 9


def test_close_without_waiting_reaches_remote_processes(cluster: Cluster, gates: Gates) -> None:
    held = [gates(f"close{i}") for i in range(2)]
    q = ProcQueue({LANE: DaskLane(cluster.address, workers=2)})
    try:
        handles = [
            q.push(Job(f"c{i}", jobs_dask.report_then_block, args=(g.started,), lane=LANE)).handle
            for i, g in enumerate(held)
        ]
        remote = [psutil.Process(int(jobs.wait_signal(g.started, WAIT).split()[0])) for g in held]
    finally:
        q.close(wait=False)
    for h in handles:
        with pytest.raises(JobFailed) as raised:
            h.result(timeout=WAIT)
        assert raised.value.failure.kind == "cancelled"
    _, alive = psutil.wait_procs(remote, timeout=WAIT)
    assert not alive
    assert cluster.procq_processes() == []  # nothing left on the far side either


def test_close_without_waiting_cuts_short_a_remote_grace(cluster: Cluster, tmp_path: Path) -> None:
    """A cancelled job whose tree ignores SIGTERM, on the cluster, in its
    10 s grace: closing without waiting SIGKILLs it there at once."""
    started, termed = jobs.fifo(tmp_path, "started"), jobs.fifo(tmp_path, "termed")
    with dask_queue(cluster, workers=1, kill_grace=10.0) as q:
        handle = q.push(Job("stubborn", jobs_grace.stubborn_tree, args=(termed, started), lane=LANE)).handle
        remote = [psutil.Process(int(p)) for p in wait_started(handle, started).split()]
        assert q.cancel("stubborn")
        wait_started(handle, termed)  # its grace runs, on the Dask worker
        start = time.monotonic()
        q.close(wait=False)
        took = time.monotonic() - start
        assert took < 1.0, f"close(wait=False) took {took:.2f}s during a remote 10s grace"
        with pytest.raises(JobFailed) as raised:
            handle.result(timeout=0)
        assert raised.value.failure.kind == "cancelled"
    _, alive = psutil.wait_procs(remote, timeout=WAIT)
    assert not alive


# --- the lane's surface ----------------------------------------------------------------


def test_an_existing_client_is_used_and_left_open(cluster: Cluster) -> None:
    with distributed.Client(cluster.address, set_as_default=False) as client:
        with open_queue({LANE: DaskLane(client, workers=1)}) as q:
            assert q.push_and_wait(Job("x", jobs.square, args=(4,)), timeout=WAIT) == 16
        assert client.status == "running"
        assert client.submit(jobs.square, 2).result(timeout=WAIT) == 4


def test_a_scheduler_that_reruns_tasks_is_refused(cluster: Cluster) -> None:
    import dask

    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 3}),
        distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as reruns,
        pytest.raises(ValueError, match=r"allowed-failures is 3\), so a job whose worker died would run again"),
    ):
        ProcQueue({LANE: DaskLane(reruns.scheduler_address)})


def test_untrusted_cluster_lanes_are_refused() -> None:
    with pytest.raises(ValueError, match="a DaskLane cannot be untrusted"):
        DaskLane("tcp://127.0.0.1:1", trusted=False)
    with pytest.raises(TypeError, match="must be a scheduler address"):
        DaskLane(42)
