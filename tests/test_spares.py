"""Warm spare workers (``Lane.spare_workers``) and starts off the I/O thread.

A lane keeps no spare until one of its jobs crashes; then it keeps up to
``spare_workers`` booted workers that take no job, and a worker that dies or
retires is replaced by one at once. Spares are processes of the queue: they
are stopped and reaped at close like workers, and a start still under way
when the queue stops is reaped too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import jobs
import psutil
import pytest
from core_support import WAIT, BlockingCall, failure_of, open_queue, wait_until

from procq import Job, Lane, ProcQueue
from procq._core.entries import LaneState, WorkerLife
from procq._model.job import DEFAULT_SPARE_WORKERS
from procq._supervisor.channel_trusted import TrustedChannel


def lane_of(q: ProcQueue, name: str = "default") -> LaneState:
    return q._core.lanes[name]


def spare_pids(q: ProcQueue, ready: bool = True) -> set[int]:
    """The pids of the lane's spares (only the READY ones, with ``ready``)."""
    with q._core.lock:
        return {w.pid for w in lane_of(q).spares if w.pid and (w.life is WorkerLife.READY or not ready)}


def in_flight(q: ProcQueue) -> int:
    return sum(q._supervisor._starts._starter.in_flight.values())


def crash(q: ProcQueue, key: str) -> None:
    """Push a job that SIGKILLs its worker; it fails, kind "crashed"."""
    failure_of(q.push(Job(key, jobs.sigkill_self)).handle, "crashed")


def warm(q: ProcQueue, spares: int) -> set[int]:
    """Wait until the lane has ``spares`` READY spares, all its workers are
    READY and nothing is being started; returns the spares' pids."""

    def settled() -> bool:
        with q._core.lock:
            lane = lane_of(q)
            workers_ready = all(w.life is WorkerLife.READY for w in lane.workers)
            full = len(lane.workers) == lane.spec.workers and lane.starting == 0
        return workers_ready and full and len(spare_pids(q)) == spares and in_flight(q) == 0

    wait_until(settled, what=f"{spares} warm spares")
    return spare_pids(q)


def gone(pids: set[int]) -> bool:
    """Has every process in ``pids`` exited and been reaped?"""
    for pid in pids:
        try:
            psutil.Process(pid)  # (a zombie is still there: not reaped)
        except psutil.NoSuchProcess:
            continue
        return False
    return True


@pytest.fixture
def slow_start(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, threading.Event, list[int]]]:
    """Make every trusted start on a starter thread (not a queue's first
    workers) hang after its process is started, until ``go`` is set:
    (started, go, pids started)."""
    started, go = threading.Event(), threading.Event()
    pids: list[int] = []
    original: Callable[..., Any] = TrustedChannel.start

    def start(cls: type[TrustedChannel], lane: LaneState, launch: Any) -> TrustedChannel:
        channel = original(lane, launch)
        if not threading.current_thread().name.startswith("procq-starter-"):
            return channel
        pids.append(channel.pid)
        started.set()
        assert go.wait(WAIT), "the test never let the start end"
        return channel

    monkeypatch.setattr(TrustedChannel, "start", classmethod(start))
    try:
        yield started, go, pids
    finally:
        go.set()


# --- the option ------------------------------------------------------------------


def test_spare_workers_default_and_values() -> None:
    assert Lane().spare_workers == DEFAULT_SPARE_WORKERS
    assert Lane(spare_workers=0).spare_workers == 0
    assert Lane(spare_workers=5).spare_workers == 5
    assert Lane(trusted=False).spare_workers == 0
    assert Lane(trusted=False, spare_workers=0).spare_workers == 0


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True, 10**6])
def test_spare_workers_bad_values_are_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"^lane spare_workers must be an int from 0 to 4096 or None, got "):
        Lane(spare_workers=bad)


def test_untrusted_lanes_have_no_spares() -> None:
    with pytest.raises(ValueError, match=r"^lane spare_workers must be 0 or None for an untrusted lane .*got 1$"):
        Lane(trusted=False, spare_workers=1)


# --- spares in a queue -------------------------------------------------------------


def test_no_spare_before_a_crash() -> None:
    """A lane whose jobs never crash keeps no spare; an error or a kill
    for a time limit is no crash."""
    with open_queue({"default": Lane(workers=2, spare_workers=2)}) as q:
        assert q.push_and_wait(Job("a", jobs.square, args=(3,))) == 9
        failure_of(q.push(Job("b", jobs.boom)).handle, "error")
        failure_of(q.push(Job("c", jobs.block_forever, timeout=0.2)).handle, "timeout")
        assert q.push_and_wait(Job("d", jobs.square, args=(4,))) == 16
        warm(q, 0)  # the replacement of the killed worker is in, and no spare
        assert q.stats().lanes["default"].spares == 0


def test_spares_appear_in_stats_after_a_crash() -> None:
    with open_queue({"default": Lane(workers=2, spare_workers=2)}) as q:
        crash(q, "die")
        pids = warm(q, 2)
        stats = q.stats().lanes["default"]
        assert stats.spares == 2
        assert stats.workers_alive == 2  # spares are not workers
        assert stats.crashes == 1 and stats.worker_restarts == 1
        assert not pids & set(q._worker_pids())
        q._check_invariants()


def test_a_crash_promotes_a_spare_and_the_next_job_runs_on_it() -> None:
    with open_queue({"default": Lane(workers=1, spare_workers=1)}) as q:
        crash(q, "first")  # turns spares on
        spares = warm(q, 1)
        crash(q, "second")
        assert q.push_and_wait(Job("next", jobs.getpid)) in spares
        warm(q, 1)  # and another spare replaces the one promoted
        stats = q.stats().lanes["default"]
        assert stats.crashes == 2 and stats.worker_restarts == 2 and stats.workers_alive == 1


def test_a_retired_worker_is_replaced_by_a_spare() -> None:
    with open_queue({"default": Lane(workers=1, spare_workers=1, max_jobs_per_worker=2)}) as q:
        crash(q, "die")
        spares = warm(q, 1)
        first = {q.push_and_wait(Job(f"job{i}", jobs.getpid)) for i in range(2)}
        assert len(first) == 1 and not first & spares  # the replacement started for the crash
        assert q.push_and_wait(Job("after", jobs.getpid)) in spares


@pytest.mark.parametrize("spares", [{"spare_workers": 0}, {}], ids=["off", "default"])
def test_spares_off_means_no_spare_process(spares: dict[str, Any]) -> None:
    with open_queue({"default": Lane(workers=2, **spares)}) as q:
        for i in range(3):
            crash(q, f"die{i}")
        warm(q, 0)
        assert q.push_and_wait(Job("ok", jobs.square, args=(5,))) == 25
        assert q.stats().lanes["default"].spares == 0
        with q._core.lock:
            assert not lane_of(q).spares


@pytest.mark.parametrize("wait", [True, False])
def test_spares_are_reaped_at_close(wait: bool) -> None:
    with open_queue({"default": Lane(workers=1, spare_workers=2)}) as q:
        crash(q, "die")
        spares = warm(q, 2)
        workers = set(q._worker_pids())
        q.close(wait=wait)
        assert gone(spares | workers)
        assert q.stats().lanes["default"].spares == 0


def test_a_spare_that_dies_is_replaced_by_another_spare() -> None:
    with open_queue({"default": Lane(workers=1, spare_workers=1)}) as q:
        crash(q, "die")
        (spare,) = warm(q, 1)
        psutil.Process(spare).kill()
        wait_until(lambda: spare_pids(q) - {spare}, what="a new spare")
        assert q.push_and_wait(Job("ok", jobs.square, args=(6,))) == 36
        assert q.stats().lanes["default"].crashes == 1  # a spare's death fails no job


# --- starts off the I/O thread --------------------------------------------------------


def test_a_start_under_way_does_not_stall_deaths(
    slow_start: tuple[threading.Event, threading.Event, list[int]],
) -> None:
    """While a replacement's start hangs on the starter thread, the I/O
    thread still answers another crash, then registers both replacements."""
    started, go, pids = slow_start
    with open_queue({"default": Lane(workers=2, spare_workers=0)}) as q:
        crash(q, "one")
        assert started.wait(WAIT)
        crash(q, "two")  # answered while the first replacement's start still hangs
        assert q.stats().lanes["default"].workers_alive == 2  # (reserved places count as alive)
        go.set()
        warm(q, 0)
        assert set(pids) == set(q._worker_pids())
        assert q.push_and_wait(Job("ok", jobs.square, args=(7,))) == 49


@pytest.mark.parametrize("wait", [True, False])
def test_closing_while_a_start_is_under_way_leaves_nothing(
    slow_start: tuple[threading.Event, threading.Event, list[int]], wait: bool
) -> None:
    started, go, pids = slow_start
    with open_queue({"default": Lane(workers=1)}) as q:
        crash(q, "die")
        assert started.wait(WAIT)
        closing = BlockingCall(lambda: q.close(wait=wait))
        closing.wait_blocked()  # it waits for the start under way
        go.set()
        closing.outcome()
        assert pids and gone(set(pids))
        assert q._worker_pids() == [] and in_flight(q) == 0
