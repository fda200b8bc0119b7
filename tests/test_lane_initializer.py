"""A lane's initializer: it runs in every worker as it starts (a replacement
too), its arguments travel with the worker's start (``multiprocessing``'s own
objects among them), a failing one fails only the next job of its worker,
and a main script's initializer and jobs share the worker's main module."""

from __future__ import annotations

import multiprocessing
import os
import queue
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import jobs_initializer as ji
import pytest

from procq import InitializerFailed, Job, JobFailed, JobPicklingError, Lane, ProcQueue

ROOT = str(Path(__file__).resolve().parent.parent)


def _drain(log: Any, n: int) -> list[tuple[str, int]]:
    """The first ``n`` messages on ``log`` (each wait bounded)."""
    return [log.get(timeout=30) for _ in range(n)]


@pytest.mark.timeout(120)
def test_every_worker_start_runs_the_initializer_once_with_multiprocessing_objects(start_method: str) -> None:
    ctx = multiprocessing.get_context(start_method)
    log, starts = ctx.Queue(), ctx.Value("i", 0)
    lane = Lane(workers=2, spare_workers=0, initializer=ji.announce, initargs=(log, starts, "T"))
    try:
        with ProcQueue({"a": lane}, start_method=start_method) as q:
            first = {q.push_and_wait(Job(f"where{i}", ji.where), 30) for i in range(4)}
            with pytest.raises(JobFailed) as info:
                q.push_and_wait(Job("die", ji.die), 30)
            assert info.value.failure.signal == "SIGKILL"
            # The replacement (forked from the lane's template under the
            # forkserver) ran the initializer, with the queue and the counter.
            after = {q.push_and_wait(Job(f"after{i}", ji.where), 30) for i in range(6)}
            restarts = q.stats().lanes["a"].worker_restarts
            # Read while the queue is open: the jobs above may all have run on
            # the surviving worker, and a close drops a start not yet begun.
            messages = _drain(log, 3)
        assert restarts == 1
        assert {tag for _, tag in first | after} == {"T"}
        started = [pid for what, pid in messages if what == "started"]
        assert len(started) == len(set(started)) == 3  # once per worker start, 2 + 1 replacement
        assert {pid for pid, _ in first | after} <= set(started)
        assert starts.value == 3
        with pytest.raises(queue.Empty):
            log.get(timeout=0.2)  # and nothing more
    finally:
        log.close()
        log.join_thread()


@pytest.mark.timeout(120)
def test_a_failing_initializer_fails_the_next_job_and_runs_again_before_the_one_after(start_method: str) -> None:
    ctx = multiprocessing.get_context(start_method)
    attempts = ctx.Value("i", 0)
    lane = Lane(workers=1, initializer=ji.fails_first, initargs=(attempts,))
    with ProcQueue({"a": lane}, start_method=start_method) as q:
        with pytest.raises(JobFailed) as info:
            q.push_and_wait(Job("first", os.getpid), 30)
        failure = info.value.failure
        assert failure.kind == "error"
        cause = info.value.__cause__
        assert isinstance(cause, InitializerFailed)
        assert "initializer fails_first() failed" in str(cause) and "the database is not up yet" in str(cause)
        assert "ConnectionError: the database is not up yet" in failure.traceback
        # The worker stayed up; its next job ran the initializer again, which worked.
        assert q.push_and_wait(Job("second", os.getpid), 30) == failure.pid
        assert q.push_and_wait(Job("tag", ji.where_tag), 30) == "ready"
        assert q.stats().lanes["a"].worker_restarts == 0
    assert attempts.value == 2


@pytest.mark.timeout(120)
def test_an_initializer_that_kills_its_worker_fails_the_waiting_jobs_and_says_so() -> None:
    with ProcQueue({"a": Lane(workers=1, initializer=ji.exit_now)}) as q:
        with pytest.raises(JobFailed) as info:
            q.push_and_wait(Job("never", os.getpid), 60)
        assert info.value.failure.kind == "crashed"
        assert "keep dying while they start" in info.value.failure.message
        assert "the lane's initializer ends the process" in info.value.failure.message


def test_initargs_that_cannot_travel_refuse_the_queue_and_name_the_lane() -> None:
    with pytest.raises(JobPicklingError, match=r"lane 'setup': its initializer and initargs must be picklable"):
        ProcQueue({"setup": Lane(initializer=ji.announce, initargs=(threading.Lock(), None, "x"))})


def test_a_lock_of_another_start_method_refuses_the_queue() -> None:
    """A ``multiprocessing.Queue()`` of the default (fork) context cannot go
    to a forkserver worker: said at ``ProcQueue()``, naming the lane."""
    log = multiprocessing.get_context("fork").Queue()
    try:
        with pytest.raises(JobPicklingError, match=r"lane 'a': .*made from the queue's start method's context"):
            ProcQueue({"a": Lane(initializer=ji.announce, initargs=(log, None, "x"))}, start_method="forkserver")
    finally:
        log.close()


def test_a_lambda_is_an_initializer() -> None:
    with ProcQueue({"a": Lane(initializer=lambda: ji.STATE.update(tag="lambda"))}) as q:
        assert q.push_and_wait(Job("tag", ji.where_tag), 30) == "lambda"


def test_lane_initializer_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="lane initializer must be a callable or None, got int"):
        Lane(initializer=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="lane initargs must be a tuple, got list"):
        Lane(initializer=print, initargs=[1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="initargs were given without an initializer"):
        Lane(initargs=(1,))
    with pytest.raises(ValueError, match="an untrusted lane has no initializer"):
        Lane(trusted=False, initializer=print)
    # Arguments are part of the lane, but not of its hash: they may be lists or arrays.
    assert hash(Lane(initializer=print, initargs=([1],))) == hash(Lane(initializer=print))


# A main script whose initializer and jobs share its globals in the worker, as
# under ProcessPoolExecutor; a job defined under the guard still runs (sent
# by value), and a program without a main file runs the same lane.
SCRIPT = textwrap.dedent(
    """
    import os

    from procq import Executor, Job, Lane, ProcQueue

    MODEL = None


    def load(name):
        global MODEL
        MODEL = f"{name} in {os.getpid()}"


    def predict(x):
        return MODEL, x


    if __name__ == "__main__":
        def local(x):
            return x * 2

        with ProcQueue({"a": Lane(workers=2, initializer=load, initargs=("model",))}) as q:
            outputs = [q.push_and_wait(Job(f"p{i}", predict, args=(i,)), 30) for i in range(4)]
            print("QUEUE", all(m is not None and m.startswith("model in ") for m, _ in outputs))
            print("GUARDED", q.push_and_wait(Job("local", local, args=(21,)), 30))
        with Executor(2, initializer=load, initargs=("executor",)) as ex:
            print("EXECUTOR", sorted({m.split(" in ")[0] for m, _ in ex.map(predict, range(6))}))
    """
)


@pytest.mark.timeout(120)
def test_a_main_scripts_initializer_sets_what_its_jobs_read(tmp_path: Path) -> None:
    script = tmp_path / "pipeline.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=100, cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["QUEUE True", "GUARDED 42", "EXECUTOR ['executor']"]


@pytest.mark.timeout(120)
def test_a_program_without_a_main_file_runs_a_lane_with_an_initializer(tmp_path: Path) -> None:
    """``python -c``: no main module in the workers; the initializer and the
    job travel by value, and each runs."""
    code = textwrap.dedent(
        """
        from procq import Job, Lane, ProcQueue

        def load(seen):
            seen.append("loaded")
            print("INIT", flush=True)

        def double(x):
            return x * 2

        with ProcQueue({"a": Lane(initializer=load, initargs=([],))}) as q:
            print("RESULT", q.push_and_wait(Job("d", double, args=(21,)), 30))
        """
    )
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=100, cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["INIT", "RESULT 42"]
