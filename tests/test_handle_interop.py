"""JobHandle as a future: exception(), add_done_callback(), cancel(), future(), procq.as_completed; q.map's options."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import sys
import threading
import types

import jobs
import pytest

import procq
from procq import Job, JobFailed, ProcQueue, Queued


def test_exception_callback_future_and_as_completed() -> None:
    with ProcQueue(2) as q:
        ok = q.push(Job("ok", jobs.square, (3,)))
        bad = q.push(Job("bad", jobs.boom))
        assert isinstance(ok, Queued) and isinstance(bad, Queued)
        seen: list[str] = []
        called = threading.Event()
        ok.handle.add_done_callback(lambda h: (seen.append(h.key), called.set()))
        ended = list(procq.as_completed([ok.handle, bad.handle], timeout=30))
        assert {h.key for h in ended} == {"ok", "bad"}
        assert ok.handle.exception() is None
        assert isinstance(bad.handle.exception(), JobFailed)
        assert called.wait(30) and seen == ["ok"]
        late: list[str] = []
        ok.handle.add_done_callback(lambda h: late.append(h.key))  # done: at once
        assert late == ["ok"]
        fut = ok.handle.future()
        assert isinstance(fut, cf.Future) and fut.result(timeout=30) == 9
        with pytest.raises(JobFailed):
            bad.handle.future().result(timeout=30)
        assert not ok.handle.cancel()  # ended


def test_cancel_a_waiting_job_through_its_handle_and_future() -> None:
    with ProcQueue(1) as q:
        q.push(Job("slow", jobs.sleep, (0.5,)))
        waiting = q.push(Job("waiting", jobs.square, (2,)))
        assert isinstance(waiting, Queued)
        fut = waiting.handle.future()
        assert fut.cancel()
        assert fut.cancelled()
        assert waiting.handle.exception(timeout=30).failure.kind == "cancelled"  # type: ignore[union-attr]


def test_map_several_iterables_timeout_and_progress() -> None:
    with ProcQueue(2) as q:
        assert list(q.map(pow, [2, 3, 4], [2, 2])) == [4, 9]
        assert list(q.map(pow, range(5), range(5), chunksize=2)) == [pow(i, i) for i in range(5)]
        reports: list[tuple[int, int | None]] = []
        assert list(q.map(jobs.square, range(4), progress=lambda d, t: reports.append((d, t)))) == [0, 1, 4, 9]
        assert reports[-1] == (4, 4)
        with pytest.raises(TimeoutError):
            list(q.map(jobs.sleep, [5.0], timeout=0.2))


def test_map_progress_true_uses_tqdm(monkeypatch: pytest.MonkeyPatch) -> None:
    updates: list[int] = []

    class Bar:
        def __init__(self, total: int | None) -> None:
            self.total = total

        def update(self, n: int) -> None:
            updates.append(n)

        def close(self) -> None:
            updates.append(-1)

    auto = types.ModuleType("tqdm.auto")
    auto.tqdm = Bar  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tqdm", types.ModuleType("tqdm"))
    monkeypatch.setitem(sys.modules, "tqdm.auto", auto)
    with ProcQueue(1) as q:
        assert list(q.map(jobs.square, [1, 2], progress=True)) == [1, 4]
    assert updates == [1, 1, -1]


def test_map_progress_true_without_tqdm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with ProcQueue(1) as q, pytest.raises(ImportError, match="tqdm is not installed"):
        q.map(jobs.square, [1], progress=True)


def test_timeouts_are_positional_as_in_concurrent_futures() -> None:
    """``result(5)``, ``exception(5)``, ``push_and_wait(job, 5)``, as the
    contract writes them and as ``Future.result(5)`` takes it."""
    with ProcQueue(1) as q:
        assert q.push_and_wait(Job("sq", jobs.square, (4,)), 30) == 16
        outcome = q.push(Job("bad", jobs.boom, ("no",)))
        assert isinstance(outcome, Queued)
        assert isinstance(outcome.handle.exception(30), JobFailed)
        with pytest.raises(JobFailed):
            outcome.handle.result(30)
        ok = q.push(Job("ok", jobs.square, (5,)))
        assert isinstance(ok, Queued)
        assert ok.handle.result(30) == 25
        assert ok.handle.future().result(30) == 25
        assert ok.handle.future().exception(30) is None

        async def main() -> int:
            return await q.apush_and_wait(Job("sq2", jobs.square, (6,)), 30)

        assert asyncio.run(main()) == 36


def test_a_handle_raises_plain_job_failed_for_a_crash_not_broken_process_pool() -> None:
    """Only an Executor's futures raise BrokenProcessPool: a handle keeps to
    the contract (JobFailed), so no ``except RuntimeError`` catches a crash."""
    from concurrent.futures.process import BrokenProcessPool

    with ProcQueue(1) as q:
        outcome = q.push(Job("crash", jobs.segfault))
        assert isinstance(outcome, Queued)
        error = outcome.handle.exception(30)
        assert type(error) is JobFailed and error.failure.kind == "crashed"
        assert not isinstance(error, BrokenProcessPool)
