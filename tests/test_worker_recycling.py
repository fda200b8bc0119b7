"""Worker recycling: a lane replaces a worker after max_jobs_per_worker jobs, or once its resident
memory passes max_worker_rss."""

from __future__ import annotations

import jobs
import jobs_control
import pytest
from core_support import WAIT, open_queue
from process_support import linux_only

from procq import Job, Lane

pytestmark = pytest.mark.skipif(not linux_only, reason="job control relies on Linux process groups and /proc")


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
