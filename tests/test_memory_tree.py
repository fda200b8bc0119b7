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
@pytest.mark.parametrize(("trusted", "n"), [(True, 150), (False, 60)], ids=["trusted", "untrusted"])
def test_forked_children_sharing_memory_are_not_counted_many_times(tmp_path: Path, trusted: bool, n: int) -> None:
    hold = jobs.fifo(tmp_path, "hold")
    with open_queue({"one": Lane(workers=1, trusted=trusted)}) as q:
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


def test_tree_memory_reads_proportional_sizes_only_past_the_resident_bound() -> None:
    """The resident sizes, summed, bound the proportional ones from above: a
    tree within its limit by them is not read further; past it, the
    proportional sizes decide, and they count a page shared after a fork once."""
    from procq._system.processes import children_map, process_pss, process_rss, tree_memory

    hold_r, hold_w = os.pipe()
    block = bytearray(64 << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    me = os.getpid()
    base = process_pss(me)  # before the forks, as at a job's start
    pids = []
    try:
        for _ in range(4):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                os.close(hold_w)
                os.read(hold_r, 1)
                os._exit(0)
            pids.append(pid)
        assert set(pids) <= set(children_map()[me])
        children = {me: pids}  # (not this process's other children: a forkserver, say)
        resident = sum(process_rss(p) for p in [me, *pids]) - base
        # Within the bound: not read further, the resident sum returned as it is.
        # (With room: this process's resident size may grow a little between the two reads.)
        within = tree_memory(me, children, base, resident + (16 << 20))
        assert resident - (16 << 20) <= within <= resident + (16 << 20)
        # Four copies of 64 MiB and more by resident sizes; shared, they are
        # one, counted in base already: the children's own pages are few.
        assert resident > 4 * (64 << 20)
        assert tree_memory(me, children, base, 0) < 32 << 20
    finally:
        os.close(hold_w)
        for pid in pids:
            os.waitpid(pid, 0)
        os.close(hold_r)
