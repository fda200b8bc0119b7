"""Worker processes: where jobs run, and that none outlives the queue or its supervisor."""

from __future__ import annotations

import json
import multiprocessing.forkserver
import os
import select
import signal
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import jobs
import jobs_crashes
import psutil
import pytest
from core_support import open_queue, wait_started
from process_support import descendants_tagged, linux_only, tagged_program

from procq import Failed, Job, JobFailed, ProcQueue, Queued

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def q(start_method: str) -> Iterator[ProcQueue]:
    """A two-lane queue (cpu: 2 workers, io: 1) under each start method."""
    with open_queue({"cpu": 2, "io": 1}, start_method=start_method) as queue:
        yield queue


def _hold(q: ProcQueue, tmp_path: Any, key: str, lane: str) -> tuple[Any, int, str]:
    """Push a job that reports its pid and then waits at its own gate.
    Returns its handle, its worker's pid and the gate to release."""
    started, go = jobs.fifo(tmp_path, f"{key}-started"), jobs.fifo(tmp_path, f"{key}-go")
    outcome = q.push(Job(key, jobs.signal_and_wait, args=(started, go), lane=lane))
    assert isinstance(outcome, Queued)
    return outcome.handle, int(wait_started(outcome.handle, started)), go


# --- close() ---------------------------------------------------------------------------


@pytest.mark.parametrize("wait", [True, False], ids=["wait", "nowait"])
def test_close_leaves_no_worker_alive_or_zombie(start_method: str, tmp_path: Any, wait: bool) -> None:
    queue = ProcQueue(lanes={"cpu": 2, "io": 1}, start_method=start_method)
    try:
        assert queue.push_and_wait(Job("a", jobs.square, args=(3,), lane="cpu"), timeout=20) == 9
        assert queue.push_and_wait(Job("b", jobs.square, args=(4,), lane="io"), timeout=20) == 16
        with pytest.raises(JobFailed, match="crashed"):  # so one worker is a replacement
            queue.push_and_wait(Job("c", jobs.sigkill_self, lane="cpu"), timeout=20)
        # Busy workers too: with wait=False close() must kill them.
        held, held_pid, _ = _hold(queue, tmp_path, "held", "cpu")
        other, other_pid, _ = _hold(queue, tmp_path, "other", "cpu")
        pids = queue._worker_pids()
        assert len(pids) == 3 and {held_pid, other_pid} <= set(pids)
        procs = [psutil.Process(pid) for pid in pids]
        if wait:
            # close(wait=True) would wait for the held jobs; let them finish first.
            fds = [jobs.release(str(tmp_path / f"{k}-go")) for k in ("held", "other")]
            try:
                assert held.result(timeout=20) == held_pid and other.result(timeout=20) == other_pid
            finally:
                for fd in fds:
                    os.close(fd)
        queue.close(wait=wait)
    finally:
        queue.close(wait=False)
    assert queue._worker_pids() == []
    # is_running() is False once a process is gone *and reaped*: a zombie still "runs".
    assert [p.pid for p in procs if p.is_running()] == []
    if not wait:
        for handle in (held, other):
            with pytest.raises(JobFailed, match=r"failed: cancelled: job '(held|other)' was cancelled"):
                handle.result(timeout=20)


# --- Signals ---------------------------------------------------------------------------


def test_workers_ignore_sigint(q: ProcQueue, tmp_path: Any) -> None:
    """Ctrl-C is the supervisor's to handle: SIGINT to a busy or an idle worker
    changes nothing (with Python's default handler the held jobs would raise
    KeyboardInterrupt at once, and an idle worker would die)."""
    pids = sorted(q._worker_pids())
    assert len(pids) == 3
    # Busy: every worker holds a job (which also proves each one is up and running).
    held = _hold_everywhere(q, tmp_path, "busy")
    assert sorted(pid for _, pid, _ in held) == pids
    for pid in pids:
        os.kill(pid, signal.SIGINT)
    _release_and_check(held)
    # Idle: the same workers, now waiting for work.
    for pid in pids:
        os.kill(pid, signal.SIGINT)
    held = _hold_everywhere(q, tmp_path, "idle")
    assert sorted(pid for _, pid, _ in held) == pids
    _release_and_check(held)
    stats = q.stats()
    assert [(s.crashes, s.worker_restarts, s.failed, s.completed) for s in stats.lanes.values()] == [
        (0, 0, 0, 4),
        (0, 0, 0, 2),
    ]


def test_a_starting_worker_ignores_sigint(q: ProcQueue, tmp_path: Any) -> None:
    """SIGINT reaching workers that are still starting up (a Ctrl-C in the
    terminal right after the queue opened, or while a crashed worker is being
    replaced: workers share the terminal's process group until they run)
    fails no job.

    Under spawn the workers start with SIGINT blocked (inherited from the
    supervisor thread that starts them) and survive it. Under forkserver the
    server hands each child Python's default SIGINT handler before procq's code
    runs, so a worker hit in that window dies; it had not said READY, so it
    held no job: it is replaced, and nothing fails or counts as a crash."""
    pids = sorted(q._worker_pids())
    for pid in pids:
        os.kill(pid, signal.SIGINT)
    held = _hold_everywhere(q, tmp_path, "after")
    if q.start_method == "spawn":
        assert sorted(pid for _, pid, _ in held) == pids
    _release_and_check(held)
    stats = q.stats()
    assert [(s.crashes, s.failed) for s in stats.lanes.values()] == [(0, 0), (0, 0)]
    if q.start_method == "spawn":
        assert [s.worker_restarts for s in stats.lanes.values()] == [0, 0]


def _hold_everywhere(q: ProcQueue, tmp_path: Any, name: str) -> list[tuple[Any, int, str]]:
    """Hold one job on every worker of both lanes (cpu: 2, io: 1) at once."""
    return [_hold(q, tmp_path, f"{name}-{i}", lane) for i, lane in enumerate(["cpu", "cpu", "io"])]


def _release_and_check(held: list[tuple[Any, int, str]]) -> None:
    fds = [jobs.release(go) for _, _, go in held]
    try:
        assert [h.result(timeout=20) for h, _, _ in held] == [pid for _, pid, _ in held]
    finally:
        for fd in fds:
            os.close(fd)


# --- Where job code runs -----------------------------------------------------------------


def test_job_code_never_runs_in_the_supervisor(q: ProcQueue) -> None:
    me = os.getpid()
    pid, ancestors = q.push_and_wait(Job("parents", jobs_crashes.pid_and_ancestors, lane="cpu"), timeout=20)
    assert pid != me and pid in q._worker_pids()
    if q.start_method == "spawn":
        assert ancestors[0] == me  # the supervisor started the worker itself
    else:
        server = multiprocessing.forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
        assert ancestors[:2] == [server, me]  # forked by the forkserver, which the supervisor started

    # A closure is shipped by value: it runs on a copy of its cell, never on ours.
    seen: list[int] = []

    def record() -> int:
        seen.append(os.getpid())
        return len(seen)

    assert q.push_and_wait(Job("closure", record, lane="io"), timeout=20) == 1
    assert seen == []
    assert q.push_and_wait(Job("lambda", lambda: os.getpid(), lane="io"), timeout=20) not in (me, None)


# --- Replacement -----------------------------------------------------------------------


def test_replacements_restore_full_concurrency(q: ProcQueue, tmp_path: Any) -> None:
    """Both cpu workers crash at once; then two jobs run at the same time again,
    each on a new worker (seen from inside: both report before either is released)."""
    original = set(q._worker_pids())
    crashing = []
    for i in range(2):
        started, go = jobs.fifo(tmp_path, f"crash-{i}-started"), jobs.fifo(tmp_path, f"crash-{i}-go")
        job = Job(f"crash:{i}", jobs_crashes.report_pid_wait_then, args=(started, go, jobs.exit_now, 9), lane="cpu")
        handle = q.push(job).handle
        crashing.append((handle, int(jobs.wait_signal(started)), go))
    fds = [jobs.release(go) for _, _, go in crashing]
    try:
        for handle, pid, _ in crashing:
            with pytest.raises(JobFailed, match=rf"crashed: worker process {pid} \(lane 'cpu'\) exited with code 9"):
                handle.result(timeout=20)
    finally:
        for fd in fds:
            os.close(fd)

    held = [_hold(q, tmp_path, f"after-{i}", "cpu") for i in range(2)]
    new_pids = {pid for _, pid, _ in held}
    assert len(new_pids) == 2 and not new_pids & original
    lane = q.stats().lanes["cpu"]
    assert (lane.workers_alive, lane.running, lane.crashes, lane.worker_restarts) == (2, 2, 2, 2)
    fds = [jobs.release(go) for _, _, go in held]
    try:
        assert sorted(h.result(timeout=20) for h, _, _ in held) == sorted(new_pids)
    finally:
        for fd in fds:
            os.close(fd)
    for handle, pid, _ in crashing:
        assert isinstance(handle.state, Failed) and handle.state.failure.pid == pid


# --- The supervisor killed ----------------------------------------------------------------

_SUPERVISOR = """
import json, sys, threading
sys.path.insert(0, {tests!r})
import jobs
from procq import Job, JobFailed, ProcQueue


def crash_forever(q, ready):
    n = 0
    while True:
        try:
            q.push_and_wait(Job(f"crash:{{n}}", jobs.exit_now, lane="crash"))
        except JobFailed:
            pass
        n += 1
        if n == 3:
            ready.set()


def main():
    method, started, go, mode = sys.argv[1:5]
    lanes = {{"cpu": 2}} if mode == "steady" else {{"cpu": 2, "crash": 1}}
    q = ProcQueue(lanes=lanes, start_method=method)
    q.push(Job("long", jobs.signal_and_wait, args=(started, go), lane="cpu"))
    if mode == "restarting":
        # Keep the start method busy replacing a crashing worker while we are killed.
        ready = threading.Event()
        threading.Thread(target=crash_forever, args=(q, ready), daemon=True).start()
        ready.wait()
    print(json.dumps(q._worker_pids()), flush=True)
    sys.stdin.read()  # until killed


if __name__ == "__main__":
    main()
"""


def _read_line(stream: Any, timeout: float) -> str:
    data = b""
    fd = stream.fileno()
    while not data.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            raise TimeoutError(f"no line from the supervisor within {timeout}s (got {data!r})")
        chunk = os.read(fd, 4096)
        if not chunk:
            raise EOFError(f"the supervisor exited before printing its workers (got {data!r})")
        data += chunk
    return data.decode()


@pytest.mark.skipif(not linux_only, reason="needs PR_SET_CHILD_SUBREAPER to see orphans exit")
@pytest.mark.parametrize("mode", ["steady", "restarting"])
def test_workers_exit_when_the_supervisor_is_sigkilled(start_method: str, tmp_path: Any, mode: str) -> None:
    """A supervisor with one worker mid-job and one idle ("steady"), or with a
    worker being replaced over and over ("restarting": killed while the start
    method -- the forkserver, under forkserver -- is in use), is SIGKILLed: every
    process it started exits within a few seconds."""
    script = tmp_path / "supervisor.py"
    script.write_text(_SUPERVISOR.format(tests=TESTS_DIR))
    started, go = jobs.fifo(tmp_path, "started"), jobs.fifo(tmp_path, "go")  # go is never released
    tag = uuid.uuid4().hex
    # Run under a subreaper: the supervisor's orphans become our children, so that
    # we see them exit (and reap them) instead of PID 1 keeping them as zombies.
    argv = [sys.executable, str(script), start_method, started, go, mode]
    with tagged_program(argv, tag) as proc:
        long_pid = int(jobs.wait_signal(started, timeout=30))
        workers = json.loads(_read_line(proc.stdout, timeout=30))
        # ("restarting": the crash lane's worker may be between two lives: a
        # crash's waiter is woken before its replacement process is started.)
        assert long_pid in workers and len(workers) in ((2,) if mode == "steady" else (2, 3))
        tree = psutil.Process(proc.pid).children(recursive=True)
        tree_pids = {p.pid for p in tree}
        assert long_pid in tree_pids
        if mode == "steady":
            assert set(workers) <= tree_pids  # the busy worker and the idle one

        proc.kill()
        assert proc.wait(timeout=10) == -signal.SIGKILL
        _, alive = psutil.wait_procs(tree, timeout=10)
        assert [p.pid for p in alive] == [], "processes outlived their SIGKILLed supervisor"
        # Anything started after the snapshot (a worker mid-start) went with it too.
        late = descendants_tagged(tag)
        _, alive = psutil.wait_procs(late, timeout=10)
        assert [p.pid for p in alive] == []
