"""Jobs sent ahead to a busy worker, on a real queue: when that worker dies, the jobs it held but
never started go back to their lane and run once on its replacement."""

from __future__ import annotations

from typing import Any

import jobs
import jobs_core
import pytest
from core_support import WAIT, Gates, failure_of, open_queue
from process_support import linux_only

from procq import Job, Lane

pytestmark = pytest.mark.skipif(not linux_only, reason="job control relies on Linux process groups and /proc")


def test_a_worker_that_dies_with_jobs_sent_ahead_fails_only_the_one_it_ran(
    tmp_path: Any, gates: Gates, monkeypatch: pytest.MonkeyPatch, start_method: str
) -> None:
    """Jobs sent ahead to a worker that then dies were never started: they go
    back to their lane and run once, on its replacement. Only the job the
    worker was running fails."""
    import procq._core.dispatch

    monkeypatch.setattr(procq._core.dispatch, "PIPELINE_WINDOW", 60.0)  # every job counts as short
    requeued: list[list[str]] = []
    requeue = procq._core.dispatch.Dispatch.requeue

    def spy(self: Any, worker: Any, now: float, wakeups: Any) -> None:
        if worker.queue:  # (every worker's death passes here; most hold nothing ahead)
            requeued.append([e.key for e in worker.queue])
        requeue(self, worker, now, wakeups)

    monkeypatch.setattr(procq._core.dispatch.Dispatch, "requeue", spy)
    log = str(tmp_path / "log")
    gate = gates("first")
    with open_queue({"one": Lane(workers=1)}, start_method=start_method) as q:
        core_lane = q._core.lanes["one"]
        assert q.push_and_wait(Job("warm", jobs.getpid, lane="one"), timeout=WAIT) > 0
        first = q.push(Job("first", jobs.signal_and_wait, args=(gate.started, gate.go), lane="one")).handle
        gate.wait_started()
        killer = q.push(Job("killer", jobs.sigkill_self, lane="one")).handle
        after = [
            q.push(Job(f"after:{i}", jobs_core.record, args=(log, f"after:{i}"), lane="one")).handle for i in range(3)
        ]
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
