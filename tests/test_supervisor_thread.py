"""If the supervisor's I/O thread ever dies (a bug, or something it cannot
survive), the queue says so at once and truthfully: it is closed, a push
raises ``QueueClosed`` naming the cause, every live job fails, and every
worker is killed and reaped."""

from __future__ import annotations

from typing import Any

import jobs
import psutil
import pytest
from core_support import Gates, failure_of, hold, open_queue

from procq import Job, Lane, QueueClosed


def _reaped(pid: int) -> bool:
    try:
        psutil.Process(pid).status()
        return False
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt(), MemoryError()], ids=type)
def test_a_dead_supervisor_thread_closes_the_queue_truthfully(gates: Gates, error: BaseException) -> None:
    with open_queue({"a": 1, "b": Lane(workers=2)}) as q:
        running, pid, _ = hold(q, gates, "running", lane="a")
        waiting = q.push(Job("waiting", jobs.square, args=(2,), lane="a")).handle
        later = q.push(Job("later", jobs.square, args=(3,), lane="b", not_before=3600.0)).handle
        pids = q._worker_pids()
        assert pid in pids and len(pids) == 3
        supervisor: Any = q._supervisor

        def explode(timeout: float | None) -> Any:
            raise error

        supervisor._watcher.select = explode  # the next time the thread waits
        supervisor.wake()
        for handle in (running, waiting, later):
            failure = failure_of(handle, "cancelled")
            assert "supervisor thread died" in failure.message, failure.message
            assert type(error).__name__ in failure.message
        assert q.closed
        with pytest.raises(QueueClosed, match="supervisor thread died") as info:
            q.push(Job("after", jobs.square, args=(1,)))
        assert info.value.__cause__ is error
        supervisor._thread.join(timeout=30)
        assert not supervisor._thread.is_alive()
        assert q._worker_pids() == []
        assert all(_reaped(p) for p in pids)
        q._check_invariants()
    # close() after the death returns at once and changes nothing.
    q.close()
    assert q.closed


def test_a_dead_supervisor_thread_with_nothing_live(gates: Gates) -> None:
    with open_queue(1) as q:
        assert q.push_and_wait(Job("one", jobs.square, args=(4,))) == 16
        supervisor: Any = q._supervisor

        def explode(timeout: float | None) -> Any:
            raise RuntimeError("boom")

        supervisor._watcher.select = explode
        supervisor.wake()
        supervisor._thread.join(timeout=30)
        assert q.closed
        with pytest.raises(QueueClosed, match=r"supervisor thread died \(RuntimeError: boom\)"):
            q.push(Job("two", jobs.square, args=(5,)))
        assert q.state("one") is not None
