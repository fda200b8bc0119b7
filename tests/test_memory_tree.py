"""A job's memory is its process tree's, counted as the tree really uses it:
pages shared after a fork count once, not once per process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jobs
import jobs_hardening as hj
import pytest
from core_support import failure_of, open_queue

from procq import Completed, Job, Lane

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memory is measured through /proc")


@pytest.mark.timeout(90)
def test_forked_children_sharing_memory_are_not_counted_many_times(tmp_path: Path) -> None:
    hold = jobs.fifo(tmp_path, "hold")
    n = 150
    with open_queue({"one": Lane(workers=1)}) as q:
        handle = q.push(Job("sharers", hj.forked_sharers, args=(n, hold), memory_limit="200M")).handle
        fd = None
        try:
            # A worker's resident memory is tens of MiB: counted once per
            # process, 150 copies of it would be far past the limit. The
            # supervisor samples a limited job's tree every 50 ms; one second
            # is many samples.
            with pytest.raises(TimeoutError):
                handle.result(timeout=1.0)
        finally:
            fd = jobs.release(hold)
            os.write(fd, b"g" * n)  # one byte for each child (release() alone gives 128)
        try:
            assert handle.result(timeout=60) == n
        finally:
            os.close(fd)
        assert q.state("sharers") == Completed(n)


@pytest.mark.timeout(90)
def test_children_that_really_use_memory_still_count(tmp_path: Path) -> None:
    started, hold = jobs.fifo(tmp_path, "started"), jobs.fifo(tmp_path, "hold")
    with open_queue({"one": Lane(workers=1)}) as q:
        handle = q.push(Job("hogs", hj.allocating_children, args=(4, 60, started, hold), memory_limit="120M")).handle
        fd = None
        try:
            # Not waiting for `started`: the tree is over its limit once two of
            # the children have written their memory, and it is killed then,
            # before the job can signal (it would block there for ever, were its
            # children not counted).
            failure = failure_of(handle, "memory", timeout=30)
            assert "memory" in failure.message
        finally:
            fd = jobs.release(hold)
            os.close(fd)
