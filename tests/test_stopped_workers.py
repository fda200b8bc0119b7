"""A stopped worker (SIGSTOP, or a job that stops its own process) never
answers again. ``close(wait=True)`` may wait for it, as for any running job;
``close(wait=False)`` ends everything within a second whatever else waits,
even from another thread while a ``close()`` is waiting."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import jobs
import jobs_hardening as hj
import jobs_leftovers
import psutil
import pytest
from core_support import WAIT, failure_of, open_queue

from procq import Completed, Job, Lane


def _until_stopped(process: psutil.Process) -> None:
    """Wait until ``process`` is stopped (a SIGSTOP is delivered at once; bounded all the same)."""
    for _ in range(2000):
        if process.status() == psutil.STATUS_STOPPED:
            return
        time.sleep(0.005)
    raise AssertionError(f"process {process.pid} did not stop")


def _close_in_thread(q: object, wait: bool) -> threading.Thread:
    closer = threading.Thread(target=q.close, kwargs={"wait": wait}, daemon=True)  # type: ignore[attr-defined]
    closer.start()
    return closer


@pytest.mark.timeout(60)
def test_close_without_waiting_ends_a_stopped_worker_while_close_waits(tmp_path: Path) -> None:
    started, go = jobs.fifo(tmp_path, "started"), jobs.fifo(tmp_path, "go")
    # (The queue is held by a with block: open_queue's generator, dropped, would close it at once.)
    with open_queue({"one": Lane(workers=1)}) as q:
        handle = q.push(Job("stopped", jobs.signal_and_wait, args=(started, go))).handle
        worker = int(jobs.wait_signal(started, timeout=WAIT))
        os.kill(worker, signal.SIGSTOP)
        waiting = _close_in_thread(q, wait=True)
        waiting.join(timeout=0.5)
        assert waiting.is_alive()  # it waits for the running job, as it should
        now = _close_in_thread(q, wait=False)
        now.join(timeout=10)
        assert not now.is_alive(), "close(wait=False) blocked behind close(wait=True)"
        waiting.join(timeout=10)
        assert not waiting.is_alive()
        failure_of(handle, "cancelled", timeout=1)
        assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE


@pytest.mark.timeout(60)
def test_a_job_that_stops_its_worker_after_answering_does_not_hang_close(tmp_path: Path) -> None:
    go = jobs.fifo(tmp_path, "go")
    fd = None
    with open_queue({"one": Lane(workers=1)}) as q:
        try:
            assert q.push_and_wait(Job("stops", hj.stop_self_after, args=(go,))) == "answered"
            worker = psutil.Process(q._worker_pids()[0])
            fd = jobs.release(go)  # the worker now stops itself
            _until_stopped(worker)
            closer = _close_in_thread(q, wait=True)
            closer.join(timeout=30)
            assert not closer.is_alive(), "close() hung on a stopped idle worker"
            assert q.state("stops") == Completed("answered")
        finally:
            if fd is not None:
                os.close(fd)


@pytest.mark.timeout(60)
def test_close_without_waiting_ends_a_stopped_untrusted_job(tmp_path: Path) -> None:
    started, go = jobs.fifo(tmp_path, "started"), jobs.fifo(tmp_path, "go")
    with open_queue({"sandbox": Lane(workers=1, trusted=False)}) as q:
        handle = q.push(Job("stopped", jobs.signal_and_wait, args=(started, go))).handle
        jobs.wait_signal(started, timeout=WAIT)
        for child in psutil.Process(int(q._worker_pids()[0])).children():
            child.suspend()
        closer = _close_in_thread(q, wait=False)
        closer.join(timeout=10)
        assert not closer.is_alive()
        failure_of(handle, "cancelled", timeout=1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("trusted", [True, False], ids=["trusted", "untrusted"])
@pytest.mark.parametrize("wait", [True, False], ids=["wait", "no-wait"])
def test_a_stopped_idle_worker_is_killed_at_close_not_waited_for(trusted: bool, wait: bool) -> None:
    with open_queue({"one": Lane(workers=1, trusted=trusted)}) as q:
        assert q.push_and_wait(Job("k", jobs.square, args=(3,))) == 9
        worker = psutil.Process(q._worker_pids()[0])
        worker.suspend()
        _until_stopped(worker)
        began = time.monotonic()
        q.close(wait=wait)
        # Not the 3 s stop grace an idle worker that ignores its EOF gets.
        assert time.monotonic() - began < 2.0
        assert not worker.is_running()


@pytest.mark.timeout(60)
def test_close_without_waiting_cuts_short_the_grace_a_waiting_close_gives(tmp_path: Path) -> None:
    """close(wait=True) gives an idle worker that does not exit at EOF (a job
    left a thread running) a grace before it kills it; a close(wait=False) from
    another thread meanwhile ends it, and both closes, at once."""
    hold = jobs.fifo(tmp_path, "hold")
    with open_queue({"one": Lane(workers=1)}) as q:
        worker = psutil.Process(q.push_and_wait(Job("linger", jobs_leftovers.linger_after, args=(hold,))))
        waiting = _close_in_thread(q, wait=True)
        waiting.join(timeout=0.5)
        assert waiting.is_alive()  # in the grace
        began = time.monotonic()
        now = _close_in_thread(q, wait=False)
        now.join(timeout=10)
        waiting.join(timeout=10)
        assert not now.is_alive() and not waiting.is_alive()
        assert time.monotonic() - began < 2.0
        assert not worker.is_running()
