"""A killed job takes its whole process tree with it: whether a timeout, q.cancel(), its memory
limit or a crash of its worker ends it, no process the job started outlives it."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import jobs
import jobs_control
import pytest
from core_support import WAIT, Gates, assert_all_gone, failure_of, hold, open_queue, wait_started
from process_support import children, linux_only, subreaper

from procq import Job, Processing

pytestmark = pytest.mark.skipif(not linux_only, reason="job control relies on Linux process groups and /proc")


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
                handle = q.push(
                    Job(f"tree-{attempt}", jobs_control.tree_then_block, args=(gate, report), lane="t", timeout=limit)
                ).handle
                failure = failure_of(handle, "timeout", timeout=limit + WAIT)
                if os.path.exists(report):
                    break
            else:
                pytest.fail("the job never got as far as starting its children")
            pids = [int(p) for p in Path(report).read_text().split()]
        elif how == "memory":
            report = str(tmp_path / "pids")
            job = Job(
                "tree", jobs_control.tree_then_hog, args=(gate, report, 1024), lane="t", memory_limit="64M", timeout=30
            )
            failure = failure_of(q.push(job).handle, "memory")
            pids = [int(p) for p in Path(report).read_text().split()]
            assert len(pids) == 4
            assert re.fullmatch(
                r"job 'tree' went over its memory_limit of 64 MiB "
                r"\(its process tree held [\d.]+ [KMG]iB( \(\d+ bytes\))? more "
                rf"than the idle worker\); its worker \(pid {pids[0]}\) and that process's tree were killed",
                failure.message,
            ), failure.message
        else:
            started = jobs.fifo(tmp_path, "started")
            own_session = how == "cancel"
            handle = q.push(
                Job("tree", jobs_control.tree_then_block, args=(gate, None, started, own_session), lane="t")
            ).handle
            pids = [int(p) for p in wait_started(handle, started).split()]
            assert len(pids) == (3 if own_session else 2)
            if how == "cancel":
                assert q.cancel("tree") is True
                failure = failure_of(handle, "cancelled")
                assert (
                    failure.message
                    == "job 'tree' was cancelled by q.cancel() while it ran; its worker's process tree was killed"
                )
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
