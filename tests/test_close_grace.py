"""A kill's grace and closing without waiting: ``close(wait=False)``, and a
Ctrl-C in the ``with`` block, SIGKILL every job tree still being ended (a
cancel's or a timeout's SIGTERM, waiting out ``kill_grace``) and return
within a second, leaving no process; a memory kill waits out no grace; a
grace past an hour is refused; and a cancelled job's handle answers once its
tree is gone, holding its key until then."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jobs
import jobs_grace
import pytest
from core_support import WAIT, assert_all_gone, failure_of, open_queue, wait_started
from dask_cluster import import_distributed
from process_support import linux_only, subreaper

from procq import DaskLane, InFlight, Job, Lane, Processing, ProcQueue, Queued
from procq._model.settings import MAX_KILL_GRACE

#: The tests that end process trees adopt the orphans, to see each one exit.
subreaping = pytest.mark.skipif(not linux_only, reason="needs PR_SET_CHILD_SUBREAPER to see orphans exit")

#: The grace of the jobs below: far longer than any close may take.
LONG_GRACE = 10.0
#: What ``close(wait=False)`` promises (docs/guarantees.md): everything ends within a second.
PROMISE = 1.0
TESTS_DIR = str(Path(__file__).parent)


def _pids(report: bytes) -> list[int]:
    return [int(p) for p in report.split()]


def _close_without_waiting(q: ProcQueue) -> float:
    """Close ``q`` without waiting; how long that took, in seconds."""
    start = time.monotonic()
    q.close(wait=False)
    return time.monotonic() - start


@subreaping
def test_closing_cuts_short_the_grace_of_a_cancelled_job(tmp_path: Path) -> None:
    """The issue's program: a job that ignores SIGTERM and spins, with a
    child that ignores it too, cancelled in a lane with a 10 s grace."""
    started, termed = jobs.fifo(tmp_path, "started"), jobs.fifo(tmp_path, "termed")
    with subreaper(), open_queue({"a": Lane(workers=1, kill_grace=LONG_GRACE)}) as q:
        handle = q.push(Job("stubborn", jobs_grace.stubborn_tree, args=(termed, started))).handle
        pids = _pids(wait_started(handle, started))
        assert q.cancel("stubborn")
        assert _pids(wait_started(handle, termed)) == pids  # SIGTERM reached it: its grace runs
        assert not handle.done()
        took = _close_without_waiting(q)
        assert took < PROMISE, f"close(wait=False) took {took:.2f}s during a {LONG_GRACE:g}s grace"
        assert q._worker_pids() == []
        failure = failure_of(handle, "cancelled", timeout=0)
        assert failure.signal == "SIGKILL"
        assert_all_gone(pids)


@subreaping
def test_closing_cuts_short_the_grace_of_a_timed_out_job(tmp_path: Path) -> None:
    termed = jobs.fifo(tmp_path, "termed")
    lane = Lane(workers=1, timeout=2.0, kill_grace=LONG_GRACE)
    with subreaper(), open_queue({"a": lane}) as q:
        handle = q.push(Job("slow", jobs_grace.stubborn_tree, args=(termed,))).handle
        pids = _pids(wait_started(handle, termed))  # its timeout's SIGTERM: its grace runs
        assert not handle.done()
        took = _close_without_waiting(q)
        assert took < PROMISE, f"close(wait=False) took {took:.2f}s during a {LONG_GRACE:g}s grace"
        assert q._worker_pids() == []
        # Its end was decided at its timeout: closing does not make it "cancelled".
        failure = failure_of(handle, "timeout", timeout=0)
        assert failure.signal == "SIGKILL"
        assert_all_gone(pids)


@subreaping
def test_a_memory_kill_waits_out_no_grace(tmp_path: Path) -> None:
    """A job past its memory limit is SIGKILLed at once (a grace would let it
    grow on), whatever its lane's grace: here an hour, ignored by a job and a
    child that both ignore SIGTERM. Nothing is left for a close to wait on."""
    started = jobs.fifo(tmp_path, "started")
    lane = Lane(workers=1, memory_limit="64M", kill_grace=MAX_KILL_GRACE)
    with subreaper(), open_queue({"a": lane}) as q:
        handle = q.push(Job("hog", jobs_grace.stubborn_hog, args=(started, 256))).handle
        pids = _pids(wait_started(handle, started))
        failure = failure_of(handle, "memory")  # (within WAIT: not an hour)
        assert failure.signal == "SIGKILL"
        took = _close_without_waiting(q)
        assert took < PROMISE, f"close(wait=False) took {took:.2f}s"
        assert_all_gone(pids)


@subreaping
def test_closing_kills_at_once_a_job_cancelled_just_before(tmp_path: Path) -> None:
    """A cancel whose SIGTERM the I/O thread has not sent yet when the queue
    closes without waiting: the tree gets SIGKILL, no grace."""
    started, termed = jobs.fifo(tmp_path, "started"), jobs.fifo(tmp_path, "termed")
    with subreaper(), open_queue({"a": Lane(workers=1, kill_grace=LONG_GRACE)}) as q:
        handle = q.push(Job("stubborn", jobs_grace.stubborn_tree, args=(termed, started))).handle
        pids = _pids(wait_started(handle, started))
        start = time.monotonic()
        assert q.cancel("stubborn")
        q.close(wait=False)
        took = time.monotonic() - start
        assert took < PROMISE, f"cancel() then close(wait=False) took {took:.2f}s"
        failure = failure_of(handle, "cancelled", timeout=0)
        assert failure.signal == "SIGKILL"
        assert_all_gone(pids)


# --- Ctrl-C in the with block ------------------------------------------------------

_PROGRAM = """
import json, sys, time
sys.path.insert(0, {tests!r})
import jobs, jobs_grace
from procq import Job, JobFailed, Lane, ProcQueue


def main():
    directory = sys.argv[1]
    started, termed = jobs.fifo(directory, "started"), jobs.fifo(directory, "termed")
    interrupted = None
    try:
        with ProcQueue({{"a": Lane(workers=1, kill_grace={grace!r})}}) as q:
            handle = q.push(Job("stubborn", jobs_grace.stubborn_tree, args=(termed, started))).handle
            jobs.wait_signal(started)
            assert q.cancel("stubborn")
            pids = jobs.wait_signal(termed).decode()  # in its grace
            try:
                print(pids, flush=True)
                sys.stdin.readline()  # until Ctrl-C
            except KeyboardInterrupt:
                interrupted = time.monotonic()
                raise
    except KeyboardInterrupt:
        took = time.monotonic() - interrupted
        try:
            handle.result(timeout=0)
        except JobFailed as e:
            kind = e.failure.kind
        print(json.dumps({{"took": took, "kind": kind, "workers": q._worker_pids()}}), flush=True)


if __name__ == "__main__":
    main()
"""


def _line(proc: subprocess.Popen[bytes], timeout: float = WAIT) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"the program printed nothing within {timeout}s"
    line = proc.stdout.readline()
    assert line, "the program exited without printing its line"
    return line.decode()


@subreaping
def test_ctrl_c_in_the_with_block_cuts_short_a_grace(tmp_path: Path) -> None:
    script = tmp_path / "program.py"
    script.write_text(_PROGRAM.format(tests=TESTS_DIR, grace=LONG_GRACE))
    with subreaper():
        proc = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        try:
            pids = _pids(_line(proc).encode())
            proc.send_signal(signal.SIGINT)
            closed: dict[str, Any] = json.loads(_line(proc))
            assert proc.wait(timeout=WAIT) == 0
            assert closed["took"] < PROMISE, f"the with block took {closed['took']:.2f}s to close on Ctrl-C"
            assert closed["kind"] == "cancelled"
            assert closed["workers"] == []
            assert_all_gone(pids)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=WAIT)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()


# --- How long a grace may be ---------------------------------------------------------


TOO_LONG = [float("inf"), 1e9, MAX_KILL_GRACE + 0.5, float("nan")]


def _refused(grace: float) -> str:
    return rf"^lane kill_grace must be a number of seconds from 0 to 3600 \(an hour\), got {re.escape(repr(grace))}$"


@pytest.mark.parametrize("grace", TOO_LONG)
def test_a_grace_past_an_hour_is_refused(grace: float) -> None:
    with pytest.raises(ValueError, match=_refused(grace)):
        Lane(kill_grace=grace)


def test_a_dask_lane_refuses_a_grace_past_an_hour() -> None:
    import_distributed()  # (or skipped)
    for grace in TOO_LONG:
        with pytest.raises(ValueError, match=_refused(grace)):
            DaskLane("tcp://127.0.0.1:8786", kill_grace=grace)
    assert DaskLane("tcp://127.0.0.1:8786", kill_grace=3600).kill_grace == 3600.0


def test_a_grace_of_an_hour_is_accepted() -> None:
    assert Lane(kill_grace=MAX_KILL_GRACE).kill_grace == MAX_KILL_GRACE == 3600.0


# --- When a cancelled job's handle answers -------------------------------------------


@subreaping
def test_a_cancelled_job_answers_once_its_tree_is_gone_and_holds_its_key_till_then(tmp_path: Path) -> None:
    """``cancel`` decides the job's end at once (it will end "cancelled",
    whatever it reports), but the handle answers, and the key is free, only
    once the job's worker has exited: a push in between joins the ending job,
    so no second execution of the key starts beside a tree still cleaning up."""
    started, termed = jobs.fifo(tmp_path, "started"), jobs.fifo(tmp_path, "termed")
    with subreaper(), open_queue({"a": Lane(workers=1, kill_grace=LONG_GRACE)}, on_mismatch="ignore") as q:
        handle = q.push(Job("stubborn", jobs_grace.stubborn_tree, args=(termed, started))).handle
        pids = _pids(wait_started(handle, started))
        assert q.cancel("stubborn")
        wait_started(handle, termed)
        # In its grace (10 s from the SIGTERM): the end is decided, the tree still runs.
        assert not handle.done()
        assert q.state("stubborn") == Processing()
        joined = q.push(Job("stubborn", jobs.square, args=(3,)))
        assert isinstance(joined, InFlight) and joined.handle.key == "stubborn"
        assert not q.cancel("stubborn")  # already being ended
        os.kill(pids[0], signal.SIGKILL)  # its worker exits, long before the grace is over
        failure = failure_of(handle, "cancelled")
        assert failure.signal == "SIGKILL"
        assert failure_of(joined.handle, "cancelled", timeout=0) == failure
        again = q.push(Job("stubborn", jobs.square, args=(3,)))
        assert isinstance(again, Queued)
        assert again.handle.result(timeout=WAIT) == 9
        assert_all_gone(pids)
