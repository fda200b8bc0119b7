from __future__ import annotations

import jobs

from procq import Cached, Job, ProcQueue, Queued


def test_push_runs_in_a_child_and_caches(queue: ProcQueue) -> None:
    import os

    first = queue.push(Job("pid", jobs.getpid))
    assert isinstance(first, Queued)
    pid = first.handle.result(timeout=20)
    assert pid != os.getpid()
    assert queue.push(Job("pid", jobs.getpid)) == Cached(pid)


def test_fifo_gate(queue: ProcQueue, tmp_path) -> None:
    started, go = jobs.fifo(tmp_path, "started"), jobs.fifo(tmp_path, "go")
    handle = queue.push(Job("gate", jobs.signal_and_wait, args=(started, go))).handle
    pid = int(jobs.wait_signal(started))
    assert not handle.done()
    fd = jobs.release(go)
    try:
        assert handle.result(timeout=20) == pid
    finally:
        import os

        os.close(fd)
