"""Lanes: concurrency limits seen from inside the children, the first lane as
default, ``lanes=N``, capacity and backpressure (``LaneFull``, the key left as
it was, joiners of an abandoned claim woken ``cancelled``), blocking and
asyncio pushes.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

import jobs
import jobs_core
import pytest
from core_support import (
    WAIT,
    BlockingCall,
    Gate,
    Gates,
    OnPickle,
    awaited,
    open_queue,
    read_log,
    within,
)

import procq._api.push
from procq import (
    Completed,
    Failed,
    InFlight,
    Job,
    JobFailed,
    JobHandle,
    Lane,
    LaneFull,
    Pending,
    Processing,
    ProcQueue,
    ProcQueueError,
    Queued,
)

# --- limits -----------------------------------------------------------------------


def test_a_lane_runs_at_most_its_workers_at_once(queue: ProcQueue, gates: Gates, log: str) -> None:
    g1, g2, g3 = gates("j1"), gates("j2"), gates("j3")

    def held(name: str, gate: Gate) -> Job[int]:
        return Job(name, jobs_core.record_signal_wait, args=(log, gate.started, gate.go, name), lane="cpu")

    h1 = queue.push(held("j1", g1)).handle
    h2 = queue.push(held("j2", g2)).handle
    pid1, pid2 = g1.wait_started(), g2.wait_started()
    assert pid1 != pid2  # two jobs running at once, in two processes
    h3 = queue.push(held("j3", g3)).handle

    # Both cpu workers are held: the third job waits.
    assert queue.state("j3") == Pending() and h3.state == Pending()
    cpu = queue.stats().lanes["cpu"]
    assert (cpu.running, cpu.waiting, cpu.workers_alive) == (2, 1, 2)
    assert sorted(read_log(log)) == sorted([f"j1 {pid1}", f"j2 {pid2}"])
    # Another lane is not held up by it.
    assert queue.push_and_wait(Job("io-job", jobs.getpid, lane="io"), timeout=WAIT) not in (pid1, pid2)

    g1.open()
    assert h1.result(timeout=WAIT) == pid1
    pid3 = g3.wait_started()
    assert pid3 == pid1  # the only free worker; no third process ever ran a cpu job
    assert queue.state("j2") == Processing()
    g2.open()
    g3.open()
    assert (h2.result(timeout=WAIT), h3.result(timeout=WAIT)) == (pid2, pid1)
    assert read_log(log)[2:] == [f"j3 {pid1}"]


def test_a_job_with_no_lane_goes_to_the_first_lane(gates: Gates, log: str) -> None:
    # "zeta" is the first lane by order of definition, not by name.
    with open_queue({"zeta": 1, "alpha": 1}) as q:
        gate = gates("zeta")
        held = q.push(Job("held", jobs_core.record_signal_wait, args=(log, gate.started, gate.go), lane="zeta"))
        zeta_pid = gate.wait_started()
        no_lane = q.push(Job("no-lane", jobs_core.record, args=(log, "no-lane")))
        assert type(no_lane) is Queued
        # It waits behind the held job although "alpha" has an idle worker.
        assert q.state("no-lane") == Pending()
        stats = q.stats()
        assert (stats.lanes["zeta"].waiting, stats.lanes["alpha"].waiting) == (1, 0)
        alpha_pid = q.push_and_wait(Job("alpha-job", jobs.getpid, lane="alpha"), timeout=WAIT)
        assert alpha_pid != zeta_pid

        gate.open()
        assert held.handle.result(timeout=WAIT) == zeta_pid
        assert no_lane.handle.result(timeout=WAIT) == zeta_pid
        stats = q.stats()
        assert (stats.lanes["zeta"].completed, stats.lanes["alpha"].completed) == (2, 1)


def test_lanes_as_an_int_makes_one_default_lane_of_that_many_workers(gates: Gates, log: str) -> None:
    with open_queue(2) as q:
        assert q.lanes == {"default": Lane(workers=2)}
        stats = q.stats()
        assert list(stats.lanes) == ["default"]
        assert (stats.lanes["default"].workers, stats.lanes["default"].capacity) == (2, 1024)
        with pytest.raises(ValueError, match=r"^job 'x': unknown lane 'cpu'; this queue's lanes are 'default'$"):
            q.push(Job("x", jobs.getpid, lane="cpu"))

        ga, gb = gates("a"), gates("b")
        a = q.push(Job("a", jobs_core.record_signal_wait, args=(log, ga.started, ga.go, "a"), lane="default"))
        b = q.push(Job("b", jobs_core.record_signal_wait, args=(log, gb.started, gb.go, "b")))
        pid_a, pid_b = ga.wait_started(), gb.wait_started()
        assert pid_a != pid_b  # both at once
        assert q.stats().lanes["default"].running == 2
        ga.open()
        gb.open()
        assert (a.handle.result(timeout=WAIT), b.handle.result(timeout=WAIT)) == (pid_a, pid_b)


# --- capacity and backpressure --------------------------------------------------------


@dataclass
class FullLane:
    """A lane "one" (1 worker, capacity 1) with one job running and one waiting."""

    gate: Gate
    running: JobHandle[int]
    waiting: JobHandle[int]
    pid: int

    def drain(self) -> None:
        self.gate.open()
        assert self.running.result(timeout=WAIT) == self.pid
        assert self.waiting.result(timeout=WAIT) == self.pid


ONE = {"one": Lane(workers=1, capacity=1)}


def fill_lane_one(q: ProcQueue, gates: Gates, log: str) -> FullLane:
    """Fill lane \"one\" of ``ONE``: a job running (held at its gate) and one waiting."""
    gate = gates("running")
    running = q.push(Job("running", jobs_core.record_signal_wait, args=(log, gate.started, gate.go, "running")))
    pid = gate.wait_started()
    waiting = q.push(Job("waiting", jobs_core.record, args=(log, "waiting")))
    assert type(running) is Queued and type(waiting) is Queued
    assert q.state("waiting") == Pending()
    lane = q.stats().lanes["one"]
    assert (lane.running, lane.waiting, lane.capacity) == (1, 1, 1)
    return FullLane(gate, running.handle, waiting.handle, pid)


def lane_full_message(key: str, timeout: object, capacity: int = 1, lane: str = "one") -> str:
    """The regex LaneFull's message must match."""
    return (
        rf"^lane '{lane}' is full \(capacity {capacity}\) and had no room for job '{key}' "
        rf"within {timeout}s; the key is left as it was$"
    )


def test_a_push_into_a_full_lane_raises_lane_full_and_leaves_an_absent_key_absent(gates: Gates, log: str) -> None:
    with open_queue(ONE) as q:
        full = fill_lane_one(q, gates, log)
        job = Job("c", jobs_core.record, args=(log, "c"))
        with pytest.raises(LaneFull, match=lane_full_message("c", r"0\.2")) as info:
            q.push(job, timeout=0.2)
        assert isinstance(info.value, ProcQueueError) and isinstance(info.value, TimeoutError)
        assert q.state("c") is None
        with pytest.raises(LaneFull, match=lane_full_message("c", "0")):
            q.push(job, timeout=0)
        with pytest.raises(LaneFull, match=lane_full_message("c", r"0\.2")):
            q.push_and_wait(job, timeout=0.2)
        assert q.state("c") is None
        stats = q.stats()
        assert (stats.pending, stats.processing, stats.completed, stats.failed) == (1, 1, 0, 0)
        assert stats.lanes["one"].waiting == 1
        q._check_invariants()

        full.drain()
        # With room, even a push that will not wait at all gets in.
        assert type(q.push(job, timeout=0)) is Queued
        assert q.push_and_wait(job, timeout=WAIT) == full.pid
        assert read_log(log) == [f"running {full.pid}", f"waiting {full.pid}", f"c {full.pid}"]


def test_lane_full_leaves_a_failed_key_failed_with_the_same_failure(gates: Gates, log: str) -> None:
    with open_queue(ONE) as q:
        with pytest.raises(JobFailed, match="the first failure"):
            q.push_and_wait(Job("f", jobs.boom, args=("the first failure",)), timeout=WAIT)
        before = q.state("f")
        assert isinstance(before, Failed)
        full = fill_lane_one(q, gates, log)
        with pytest.raises(LaneFull, match=lane_full_message("f", r"0\.2")):
            q.push(Job("f", jobs_core.record, args=(log, "f")), timeout=0.2)
        after = q.state("f")
        assert after == before
        assert isinstance(after, Failed) and after.failure.message == "ValueError: the first failure"
        assert q.stats().failed == 1
        q._check_invariants()

        full.drain()
        retry = q.push(Job("f", jobs_core.record, args=(log, "f")))
        assert type(retry) is Queued  # still Failed, so fresh work
        assert retry.handle.result(timeout=WAIT) == full.pid
        assert read_log(log)[-1] == f"f {full.pid}"


@pytest.mark.parametrize("before", ["absent", "failed"])
def test_a_push_joined_to_a_claim_abandoned_by_lane_full_is_woken_cancelled(
    gates: Gates, log: str, before: str
) -> None:
    with open_queue(ONE, on_mismatch="ignore") as q:  # the joiner pushes other work on purpose
        if before == "failed":
            with pytest.raises(JobFailed):
                q.push_and_wait(Job("c", jobs.boom), timeout=WAIT)
        prior = q.state("c")
        full = fill_lane_one(q, gates, log)
        joined: dict[str, object] = {}

        def join_from_another_thread() -> None:
            # Runs while the first push pickles its arguments: it holds the claim.
            def joiner() -> None:
                joined["state"] = q.state("c")
                joined["outcome"] = q.push(Job("c", jobs_core.record, args=(log, "joiner")))

            thread = threading.Thread(target=joiner)
            thread.start()
            thread.join(WAIT)

        with pytest.raises(LaneFull, match=lane_full_message("c", r"0\.2")):
            q.push(Job("c", jobs.identity, args=(OnPickle(join_from_another_thread),)), timeout=0.2)

        assert joined["state"] == Pending()
        outcome = joined["outcome"]
        assert type(outcome) is InFlight
        handle = outcome.handle
        with pytest.raises(
            JobFailed, match=r"^job 'c' failed: cancelled: job 'c' was abandoned before it ran: "
        ) as info:
            handle.result(timeout=WAIT)
        assert info.value.failure.kind == "cancelled"
        assert handle.done()
        assert isinstance(handle.state, Failed) and handle.state.failure.kind == "cancelled"
        assert q.state("c") == prior  # the key itself is exactly as it was
        q._check_invariants()

        full.drain()
        assert not any(line.startswith(("c ", "joiner ")) for line in read_log(log))


def test_a_blocked_push_is_accepted_when_room_frees_and_runs(gates: Gates, log: str) -> None:
    with open_queue(ONE) as q:
        full = fill_lane_one(q, gates, log)
        call = BlockingCall(lambda: q.push(Job("c", jobs_core.record, args=(log, "c")), timeout=WAIT))
        call.wait_blocked()
        assert q.state("c") == Pending()
        assert q.stats().lanes["one"].waiting == 2  # the waiting job and the blocked push
        full.gate.open()
        outcome = call.outcome()
        assert type(outcome) is Queued
        assert outcome.handle.result(timeout=WAIT) == full.pid
        full.drain()
        assert read_log(log) == [f"running {full.pid}", f"waiting {full.pid}", f"c {full.pid}"]


def test_capacity_zero_lets_a_push_in_only_when_a_worker_is_free(gates: Gates, log: str) -> None:
    with open_queue({"zero": Lane(workers=1, capacity=0)}) as q:
        assert q.stats().lanes["zero"].capacity == 0
        gate = gates("running")
        running = q.push(Job("running", jobs_core.record_signal_wait, args=(log, gate.started, gate.go, "running")))
        pid = gate.wait_started()
        with pytest.raises(LaneFull, match=lane_full_message("next", r"0\.2", capacity=0, lane="zero")):
            q.push(Job("next", jobs_core.record, args=(log, "next")), timeout=0.2)
        assert q.state("next") is None

        call = BlockingCall(lambda: q.push(Job("next", jobs_core.record, args=(log, "next"))))
        call.wait_blocked()
        assert q.state("next") == Pending()
        gate.open()
        outcome = call.outcome()
        assert type(outcome) is Queued
        assert running.handle.result(timeout=WAIT) == pid
        assert outcome.handle.result(timeout=WAIT) == pid
        assert read_log(log) == [f"running {pid}", f"next {pid}"]


# --- asyncio --------------------------------------------------------------------------


@pytest.mark.parametrize("before", ["absent", "failed"])
def test_a_cancelled_apush_releases_its_claim_and_wakes_its_joiner(gates: Gates, log: str, before: str) -> None:
    with open_queue(ONE, on_mismatch="ignore") as q:  # the joiner pushes other work on purpose
        if before == "failed":
            with pytest.raises(JobFailed):
                q.push_and_wait(Job("c", jobs.boom), timeout=WAIT)
        prior = q.state("c")
        full = fill_lane_one(q, gates, log)

        async def main() -> None:
            task = asyncio.create_task(q.apush(Job("c", jobs_core.record, args=(log, "c"))))
            await asyncio.sleep(0)  # one step: the task claims "c" and waits for room
            assert not task.done()
            assert q.state("c") == Pending()
            assert q.stats().lanes["one"].waiting == 2
            joined = await q.apush(Job("c", jobs_core.record, args=(log, "joiner")))
            assert type(joined) is InFlight

            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert q.state("c") == prior
            with pytest.raises(
                JobFailed, match=r"^job 'c' failed: cancelled: job 'c' was abandoned before it ran: "
            ) as info:
                await within(awaited(joined.handle))
            assert info.value.failure.kind == "cancelled"
            assert joined.handle.done()

        asyncio.run(main())
        q._check_invariants()
        full.drain()
        assert not any(line.startswith(("c ", "joiner ")) for line in read_log(log))
        assert q.state("c") == prior


def test_apush_past_its_timeout_raises_lane_full(gates: Gates, log: str) -> None:
    with open_queue(ONE) as q:
        full = fill_lane_one(q, gates, log)
        job = Job("c", jobs_core.record, args=(log, "c"))

        async def main() -> None:
            with pytest.raises(LaneFull, match=lane_full_message("c", r"0\.2")):
                await q.apush(job, timeout=0.2)
            assert q.state("c") is None
            with pytest.raises(LaneFull, match=lane_full_message("c", "0")):
                await q.apush(job, timeout=0)
            assert q.state("c") is None
            with pytest.raises(LaneFull, match=lane_full_message("c", r"0\.2")):
                await q.apush_and_wait(job, timeout=0.2)
            assert q.state("c") is None

        asyncio.run(main())
        q._check_invariants()
        full.drain()
        assert q.push_and_wait(job, timeout=WAIT) == full.pid
        assert read_log(log)[-1] == f"c {full.pid}" and len(read_log(log)) == 3


def test_a_blocked_apush_is_accepted_when_room_frees_and_runs(gates: Gates, log: str) -> None:
    with open_queue(ONE) as q:
        full = fill_lane_one(q, gates, log)

        async def main() -> None:
            task = asyncio.create_task(q.apush(Job("c", jobs_core.record, args=(log, "c"))))
            await asyncio.sleep(0)  # one step: the task claims "c" and waits for room
            assert not task.done()
            assert q.stats().lanes["one"].waiting == 2
            full.gate.open()
            outcome = await within(task)
            assert type(outcome) is Queued
            assert await within(awaited(outcome.handle)) == full.pid

        asyncio.run(main())
        full.drain()
        assert read_log(log) == [f"running {full.pid}", f"waiting {full.pid}", f"c {full.pid}"]
        assert q.state("c") == Completed(full.pid)


def test_a_push_interrupted_while_it_waits_for_room_releases_its_claim(
    gates: Gates, log: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (KeyboardInterrupt) arriving while a push waits for room: the key
    goes back to what it was and a push that joined the claim is woken."""
    with open_queue(ONE) as q:
        full = fill_lane_one(q, gates, log)
        job = Job("c", jobs_core.record, args=(log, "c"))
        joined: list[Any] = []

        class InterruptedEvent(threading.Event):
            def wait(self, timeout: float | None = None) -> bool:
                # While the push is blocked for room: someone joins its claim,
                # then the pusher is interrupted.
                joined.append(q.push(job))
                raise KeyboardInterrupt

        monkeypatch.setattr(procq._api.push.threading, "Event", InterruptedEvent)
        with pytest.raises(KeyboardInterrupt):
            q.push(job)
        monkeypatch.undo()

        assert q.state("c") is None
        [joiner] = joined
        assert type(joiner) is InFlight
        with pytest.raises(JobFailed) as info:
            joiner.handle.result(timeout=WAIT)
        assert info.value.failure.kind == "cancelled"
        assert "the push was interrupted while it waited for room" in info.value.failure.message
        q._check_invariants()
        full.drain()
        assert q.push_and_wait(job, timeout=WAIT) == full.pid
