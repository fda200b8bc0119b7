"""push_all / apush_all (one critical section for a batch's claims) and q.map
(lazy and bounded)."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import jobs
import jobs_lifecycle
import pytest
from core_support import WAIT, Gates, open_queue

import procq._api.map
from procq import (
    Cached,
    InFlight,
    Job,
    JobFailed,
    JobPicklingError,
    KeyConflict,
    Pending,
    Queued,
)


def test_push_all_answers_one_outcome_per_job_in_order() -> None:
    with open_queue(2) as q:
        assert q.push_and_wait(Job("done", jobs.identity, args=("d",)), timeout=WAIT) == "d"
        batch = [
            Job("a", jobs.identity, args=(1,)),
            Job("done", jobs.identity, args=("d",)),
            Job("b", jobs.identity, args=(2,)),
            Job("a", jobs.identity, args=(1,)),  # resolves to the first "a"
        ]
        outcomes = q.push_all(batch)
        assert [type(o) for o in outcomes] == [Queued, Cached, Queued, InFlight]
        assert outcomes[1] == Cached("d")
        assert outcomes[3].handle._entry is outcomes[0].handle._entry  # type: ignore[union-attr]
        assert [o.handle.result(timeout=WAIT) for o in (outcomes[0], outcomes[2], outcomes[3])] == [1, 2, 1]  # type: ignore[union-attr]
        assert q.push_all([]) == []


def test_push_all_claims_nothing_when_one_job_cannot_be_pickled() -> None:
    with open_queue(1) as q:
        batch = [
            Job("a", jobs.identity, args=(1,)),
            Job("b", jobs.identity, args=(threading.Lock(),)),
            Job("c", jobs.identity, args=(3,)),
        ]
        with pytest.raises(
            JobPicklingError,
            match=r"^push_all\(\): nothing was pushed: job #1 job 'b': its arguments could not be pickled",
        ):
            q.push_all(batch)
        assert [q.state(k) for k in "abc"] == [None, None, None]
        assert q.stats().pending == 0
        with pytest.raises(TypeError, match=r"^push_all\(\): job #1 takes a procq.Job, got str$"):
            q.push_all([Job("a", jobs.identity, args=(1,)), "b"])  # type: ignore[list-item]
        assert q.state("a") is None
        q._check_invariants()


def test_push_all_claims_nothing_on_a_conflict() -> None:
    with open_queue(1, on_mismatch="raise") as q:
        assert q.push_and_wait(Job("k", jobs.identity, args=(1,)), timeout=WAIT) == 1
        with pytest.raises(KeyConflict, match=r"^key 'k' is held by a job with other arguments"):
            q.push_all([Job("new", jobs.identity, args=(0,)), Job("k", jobs.identity, args=(2,))])
        assert q.state("new") is None
        with pytest.raises(KeyConflict, match=r"^key 'x' is held by a job with another function"):
            q.push_all([Job("x", jobs.identity, args=(0,)), Job("x", jobs.square, args=(0,))])
        assert q.state("x") is None
        q._check_invariants()


def test_push_all_with_wake_moves_a_scheduled_holder() -> None:
    with open_queue(1) as q:
        first = q.push(Job("s", jobs.identity, args=(1,), not_before=3600))
        assert q.state("s") == Pending()
        [again] = q.push_all([Job("s", jobs.identity, args=(1,))], wake=True)
        assert type(again) is InFlight and again.handle.result(timeout=WAIT) == 1
        assert type(first) is Queued and first.handle.result() == 1


def test_apush_all() -> None:
    async def main() -> list[Any]:
        outcomes = await q.apush_all([Job("a", jobs.identity, args=(1,)), Job("a", jobs.identity, args=(1,))])
        assert [type(o) for o in outcomes] == [Queued, InFlight]
        return [await o.handle for o in outcomes]  # type: ignore[union-attr]

    with open_queue(1) as q:
        assert asyncio.run(main()) == [1, 1]


def test_map_yields_outputs_in_input_order() -> None:
    with open_queue(2) as q:
        assert list(q.map(jobs_lifecycle.double, range(10), keep=True)) == [2 * i for i in range(10)]
        # a second map over the same items is answered from the queue (content keys)
        assert list(q.map(jobs_lifecycle.double, range(10), keep=True)) == [2 * i for i in range(10)]
        assert q.stats().completed == 10


def test_map_forgets_the_keys_it_claimed_once_their_outputs_are_out() -> None:
    with open_queue(2) as q:
        q.push_and_wait(Job("theirs", jobs_lifecycle.double, args=(21,)), timeout=WAIT)
        assert list(q.map(jobs_lifecycle.double, [1, 21, 2], key=lambda i: "theirs" if i == 21 else f"m:{i}")) == [
            2,
            42,
            4,
        ]
        # the map's own keys are gone; a key someone else pushed is not the map's to drop
        assert q.keys() == ["theirs"]
        assert q.stats().completed == 1


@pytest.mark.parametrize("ordered", [True, False])
def test_map_in_chunks_yields_every_item_and_keys_each_chunk(ordered: bool) -> None:
    with open_queue(2) as q:
        out = list(q.map(jobs_lifecycle.double, range(25), chunksize=10, ordered=ordered, keep=True))
        assert (out if ordered else sorted(out)) == [2 * i for i in range(25)]
        keys = q.keys()
        assert len(keys) == 3 and all(k.startswith("map-chunk:") for k in keys)  # 10 + 10 + 5 items
        # the same chunks again are answered from the queue: nothing more runs
        assert list(q.map(jobs_lifecycle.double, range(25), chunksize=10, keep=True)) == [2 * i for i in range(25)]
        assert q.stats().completed == 3


def test_a_failed_chunk_fails_each_of_its_items() -> None:
    with open_queue(1) as q:
        out = list(q.map(jobs_lifecycle.fail_on_odd, [0, 2, 3, 4], chunksize=2, return_failures=True))
        assert out[:2] == [0, 2]
        assert all(isinstance(o, JobFailed) and "odd: 3" in str(o.failure) for o in out[2:]) and len(out) == 4
        with pytest.raises(ValueError, match=r"^map\(\): chunksize must be an int of at least 1, got 0$"):
            q.map(jobs.identity, [1], chunksize=0)


def test_map_unordered_yields_every_output() -> None:
    with open_queue(2) as q:
        out = list(q.map(jobs_lifecycle.double, range(20), ordered=False, key=lambda i: f"d:{i}", keep=True))
        assert sorted(out) == [2 * i for i in range(20)]
        assert q.keys(prefix="d:") == sorted(f"d:{i}" for i in range(20))


def test_map_pulls_its_input_lazily_and_in_bounded_amounts() -> None:
    pulled = 0

    def endless() -> Iterator[int]:
        nonlocal pulled
        for i in itertools.count():
            pulled += 1
            yield i

    with open_queue(2) as q:
        window = procq._api.map.WINDOW
        it = q.map(jobs_lifecycle.double, endless())
        assert pulled == 0  # nothing runs before the first next()
        got = list(itertools.islice(it, 50))
        assert got == [2 * i for i in range(50)]
        assert pulled <= 50 + window
        it.close()


@pytest.mark.parametrize("ordered", [True, False])
def test_map_failures_raise_or_come_back_as_values(ordered: bool) -> None:
    with open_queue(1) as q:
        out = list(q.map(jobs_lifecycle.fail_on_odd, range(4), return_failures=True, ordered=ordered))
        failures = [o for o in out if isinstance(o, JobFailed)]
        assert sorted(o for o in out if not isinstance(o, JobFailed)) == [0, 2]
        assert sorted(str(f.failure) for f in failures) == ["error: ValueError: odd: 1", "error: ValueError: odd: 3"]
        if ordered:
            assert out[0] == 0 and isinstance(out[1], JobFailed)
        with pytest.raises(JobFailed, match=r"odd: 1"):
            list(q.map(jobs_lifecycle.fail_on_odd, range(4), ordered=ordered, key=lambda i: f"again:{i}"))


def test_map_checks_its_arguments_at_once() -> None:
    with open_queue(1) as q:
        with pytest.raises(ValueError, match=r"unknown lane 'nope'"):
            q.map(jobs.identity, [1], lane="nope")
        with pytest.raises(TypeError, match=r"^map\(\): key must be a function of the item or None, got str$"):
            q.map(jobs.identity, [1], key="k")  # type: ignore[arg-type]


def test_map_waits_for_gated_work_without_running_ahead(gates: Gates) -> None:
    gate = gates("g")
    with open_queue(1) as q:
        items = [(gate.started, gate.go)]
        it = q.map(lambda pair: jobs.signal_and_wait(*pair), items, key=lambda pair: "gated")
        result: list[Any] = []
        t = threading.Thread(target=lambda: result.extend(it))
        t.start()
        gate.wait_started()
        assert q.keys() == ["gated"]
        gate.open()
        t.join(WAIT)
        assert not t.is_alive() and len(result) == 1 and result[0] > 0
