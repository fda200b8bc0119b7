"""Checking and claiming a key is one atomic step: N
threads or tasks racing to push one key give exactly one execution and N
identical answers.

The single execution is proven from inside the children (each run appends
``"<tag> <pid>"`` to a log file) and from the outcomes (exactly one ``Queued``).
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import jobs
import jobs_core
import pytest
from core_support import WAIT, Gates, awaited, read_log

from procq import Cached, Completed, Failed, InFlight, Job, JobFailed, ProcQueue, Queued

N = 8


def run_threads(n: int, target: Callable[[int], None]) -> list[BaseException]:
    """Run ``target(i)`` in ``n`` threads; return what they raised."""
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 2)
    assert not any(t.is_alive() for t in threads), "a racing thread hung"
    return errors


def fail_key(queue: ProcQueue, key: str, log: str) -> Failed:
    """Run a job under ``key`` that raises, so the key ends failed; returns its state."""
    with pytest.raises(JobFailed, match="failed first"):
        queue.push_and_wait(Job(key, jobs_core.boom_logged, args=(log, "failed first")), timeout=WAIT)
    state = queue.state(key)
    assert isinstance(state, Failed)
    return state


@pytest.mark.parametrize("before", ["absent", "failed"])
def test_threads_racing_to_push_one_key_run_it_once(queue: ProcQueue, gates: Gates, log: str, before: str) -> None:
    if before == "failed":
        fail_key(queue, "race", log)
    gate = gates("race")
    start = threading.Barrier(N, timeout=WAIT)
    pushed = threading.Barrier(N + 1, timeout=WAIT)  # the racers and this thread
    outcomes: dict[int, Any] = {}
    results: dict[int, int] = {}

    def racer(i: int) -> None:
        job = Job("race", jobs_core.record_and_wait, args=(log, gate.go))
        start.wait()
        try:
            outcomes[i] = queue.push(job)
        finally:
            pushed.wait()
        results[i] = outcomes[i].handle.result(timeout=WAIT)

    def release_after_pushes() -> None:
        try:
            pushed.wait()  # the job is held until every racer has its outcome
        finally:
            gate.open()

    releaser = threading.Thread(target=release_after_pushes)
    releaser.start()
    errors = run_threads(N, racer)
    releaser.join(WAIT)
    assert errors == []
    assert Counter(type(o) for o in outcomes.values()) == {Queued: 1, InFlight: N - 1}
    pids = set(results.values())
    assert len(results) == N and len(pids) == 1
    (pid,) = pids
    ran = [line for line in read_log(log) if line.startswith("ran ")]
    assert ran == [f"ran {pid}"]
    assert queue.state("race") == Completed(pid)


@pytest.mark.key_decides  # pushes other work under a held key on purpose: on_mismatch="ignore"
def test_threads_racing_after_completion_all_get_the_cached_output(queue: ProcQueue, log: str) -> None:
    pid = queue.push_and_wait(Job("settled", jobs_core.record, args=(log,)), timeout=WAIT)
    start = threading.Barrier(N, timeout=WAIT)
    outcomes: dict[int, Any] = {}

    def racer(i: int) -> None:
        start.wait()
        outcomes[i] = queue.push(Job("settled", jobs_core.record, args=(log, "again")))

    assert run_threads(N, racer) == []
    assert list(outcomes.values()) == [Cached(pid)] * N
    assert read_log(log) == [f"ran {pid}"]


def test_asyncio_tasks_racing_to_apush_one_key_run_it_once(queue: ProcQueue, gates: Gates, log: str) -> None:
    gate = gates("arace")
    job = Job("arace", jobs_core.record_and_wait, args=(log, gate.go))

    async def main() -> list[int]:
        outcomes = await gather_within_wait(*(queue.apush(job) for _ in range(N)))
        assert Counter(type(o) for o in outcomes) == {Queued: 1, InFlight: N - 1}
        gate.open()
        return await gather_within_wait(*(awaited(o.handle) for o in outcomes))

    results = asyncio.run(main())
    pid = results[0]
    assert results == [pid] * N
    assert read_log(log) == [f"ran {pid}"]


def test_tasks_on_several_loops_racing_to_apush_one_key_run_it_once(queue: ProcQueue, gates: Gates, log: str) -> None:
    gate = gates("loops")
    loops, tasks_per_loop = 4, 4
    job = Job("loops", jobs_core.record_and_wait, args=(log, gate.go), lane="io")
    start = threading.Barrier(loops, timeout=WAIT)
    pushed = threading.Barrier(loops + 1, timeout=WAIT)
    outcomes: dict[int, list[Any]] = {}
    results: dict[int, list[int]] = {}

    async def push_all() -> list[Any]:
        return await gather_within_wait(*(queue.apush(job) for _ in range(tasks_per_loop)))

    async def wait_all(outs: list[Any]) -> list[int]:
        return await gather_within_wait(*(awaited(o.handle) for o in outs))

    def thread(i: int) -> None:
        start.wait()
        try:
            outcomes[i] = asyncio.run(push_all())
        finally:
            pushed.wait()
        results[i] = asyncio.run(wait_all(outcomes[i]))

    def release_after_pushes() -> None:
        try:
            pushed.wait()
        finally:
            gate.open()

    releaser = threading.Thread(target=release_after_pushes)
    releaser.start()
    errors = run_threads(loops, thread)
    releaser.join(WAIT)
    assert errors == []
    every = [o for outs in outcomes.values() for o in outs]
    assert Counter(type(o) for o in every) == {Queued: 1, InFlight: loops * tasks_per_loop - 1}
    values = {v for vs in results.values() for v in vs}
    assert len(values) == 1 and sum(len(vs) for vs in results.values()) == loops * tasks_per_loop
    (pid,) = values
    assert read_log(log) == [f"ran {pid}"]


def test_apush_and_wait_from_racing_loops_gives_one_execution_and_one_answer(queue: ProcQueue, log: str) -> None:
    loops, tasks_per_loop = 4, 4
    start = threading.Barrier(loops, timeout=WAIT)
    answers: dict[int, list[int]] = {}

    async def wait_all() -> list[int]:
        job = Job("answer", jobs_core.record, args=(log,))
        return await gather_within_wait(*(queue.apush_and_wait(job, timeout=WAIT) for _ in range(tasks_per_loop)))

    def thread(i: int) -> None:
        start.wait()
        answers[i] = asyncio.run(wait_all())

    assert run_threads(loops, thread) == []
    values = [v for vs in answers.values() for v in vs]
    assert len(values) == loops * tasks_per_loop
    assert len(set(values)) == 1
    assert read_log(log) == [f"ran {values[0]}"]


def test_many_keys_pushed_concurrently_each_run_exactly_once(queue: ProcQueue, log: str) -> None:
    keys = [f"key-{i}" for i in range(24)]
    lanes = {key: ("cpu", "io")[i % 2] for i, key in enumerate(keys)}
    threads = 4
    start = threading.Barrier(threads, timeout=WAIT)
    seen: dict[int, dict[str, Any]] = {}

    def pusher(i: int) -> None:
        order = keys[:]
        random.Random(i).shuffle(order)
        mine: dict[str, Any] = {}
        start.wait()
        for key in order:
            mine[key] = queue.push(Job(key, jobs_core.record, args=(log, key), lane=lanes[key]))
        seen[i] = mine

    assert run_threads(threads, pusher) == []
    answers = {
        key: [
            o.output if type(o) is Cached else o.handle.result(timeout=WAIT)
            for o in (seen[i][key] for i in range(threads))
        ]
        for key in keys
    }

    logged: dict[str, list[str]] = {}
    for line in read_log(log):
        key, child = line.split()
        logged.setdefault(key, []).append(child)
    assert sorted(logged) == sorted(keys)
    for key in keys:
        assert len(logged[key]) == 1, (key, logged[key])  # ran exactly once
        (pid,) = map(int, logged[key])
        outcomes = [seen[i][key] for i in range(threads)]
        assert sum(type(o) is Queued for o in outcomes) == 1, (key, outcomes)
        assert all(type(o) in (Queued, InFlight, Cached) for o in outcomes)
        assert answers[key] == [pid] * threads, key
        assert queue.state(key) == Completed(pid)
    stats = queue.stats()
    assert (stats.pending, stats.processing, stats.completed, stats.failed) == (0, 0, len(keys), 0)
    assert stats.lanes["cpu"].completed == stats.lanes["io"].completed == len(keys) // 2


def test_racing_pushes_of_one_key_into_a_busy_lane_keep_one_claim(queue: ProcQueue, gates: Gates, log: str) -> None:
    """While the io lane's worker is held, N threads push one new key at once:
    one claims it, the rest join; it runs once when the lane frees."""
    holder = gates("holder")
    held = queue.push(Job("holder", jobs.signal_and_wait, args=(holder.started, holder.go), lane="io"))
    holder.wait_started()
    start = threading.Barrier(N, timeout=WAIT)
    outcomes: dict[int, Any] = {}

    def racer(i: int) -> None:
        start.wait()
        outcomes[i] = queue.push(Job("queued-behind", jobs_core.record, args=(log,), lane="io"))

    assert run_threads(N, racer) == []
    assert Counter(type(o) for o in outcomes.values()) == {Queued: 1, InFlight: N - 1}
    assert queue.stats().lanes["io"].waiting == 1
    holder.open()
    held.handle.result(timeout=WAIT)
    answers = {o.handle.result(timeout=WAIT) for o in outcomes.values()}
    assert len(answers) == 1
    assert read_log(log) == [f"ran {answers.pop()}"]


async def gather_within_wait(*aws: Any) -> list[Any]:
    """Gather ``aws``, all within the tests' bound on a wait."""
    return await asyncio.wait_for(asyncio.gather(*aws), WAIT)
