"""Reuse policies (how an ended key answers a push) and the payload check
(on_mismatch: a key pushed again with another function or other arguments)."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import jobs
import jobs_lifecycle
import pytest
from core_support import WAIT, Gates, open_queue

from procq import (
    Cached,
    Completed,
    Failed,
    InFlight,
    Job,
    JobFailed,
    KeyConflict,
    KeyConflictWarning,
    Pending,
    ProcQueue,
    Queued,
)
from procq._wire.fingerprint import MAX_NODES, content_key, describe, fingerprint


def test_reuse_must_be_a_known_policy() -> None:
    with pytest.raises(
        ValueError, match=r"^job 'k': reuse must be 'failed', 'always', 'never' or None, got 'sometimes'$"
    ):
        Job("k", jobs.identity, reuse="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^reuse must be 'failed', 'always' or 'never', got 'x'$"):
        ProcQueue(1, reuse="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^on_mismatch must be 'raise', 'warn' or 'ignore', got 'loud'$"):
        ProcQueue(1, on_mismatch="loud")


def test_reuse_failed_is_the_contract(tmp_path: Any) -> None:
    counter = str(tmp_path / "n")
    with open_queue(1) as q:
        job = Job("k", jobs_lifecycle.flaky, args=(counter, 1))
        with pytest.raises(JobFailed):
            q.push_and_wait(job, timeout=WAIT)
        assert q.push_and_wait(job, timeout=WAIT) == "ok"  # failed: runs fresh
        assert q.push(job) == Cached("ok")  # completed: cached
        assert jobs_lifecycle.attempts(counter) == 2


def test_reuse_always_runs_any_ended_key_again_and_old_handles_keep_their_output(tmp_path: Any) -> None:
    counter = str(tmp_path / "n")
    with open_queue(1) as q:
        first = q.push(Job("k", jobs_lifecycle.counted, args=(counter, "one")))
        assert type(first) is Queued and first.handle.result(timeout=WAIT) == "one"
        again = q.push(Job("k", jobs_lifecycle.counted, args=(counter, "two"), reuse="always"))
        assert type(again) is Queued and again.handle.result(timeout=WAIT) == "two"
        assert first.handle.result() == "one"  # the earlier run's output stays readable
        assert q.state("k") == Completed("two")
        assert q.push(Job("k", jobs_lifecycle.counted, args=(counter, "two"))) == Cached("two")
        assert jobs_lifecycle.attempts(counter) == 2
        q._check_invariants()


def test_reuse_always_as_the_queue_default(tmp_path: Any) -> None:
    counter = str(tmp_path / "n")
    with open_queue(1, reuse="always") as q:
        job = Job("k", jobs_lifecycle.counted, args=(counter, 1))
        for _ in range(3):
            outcome = q.push(job)
            assert type(outcome) is Queued and outcome.handle.result(timeout=WAIT) == 1
        assert q.push(Job("k", jobs_lifecycle.counted, args=(counter, 1), reuse="failed")) == Cached(1)
        assert jobs_lifecycle.attempts(counter) == 3


def test_reuse_always_gives_back_the_old_output_if_the_new_claim_is_abandoned() -> None:
    with open_queue(1) as q:
        assert q.push_and_wait(Job("k", jobs.identity, args=(1,)), timeout=WAIT) == 1
        core = q._core
        kind, entry, _ = core.claim(Job("k", jobs.identity, args=(2,), reuse="always"), core.default_lane)
        assert kind == "queued" and q.state("k") == Pending() and q.stats().completed == 0
        core.abandon(entry, "test")
        assert q.state("k") == Completed(1) and q.stats().completed == 1
        q._check_invariants()


def test_reuse_never_answers_a_failed_key_with_its_failure(tmp_path: Any) -> None:
    counter = str(tmp_path / "n")
    with open_queue(1) as q:
        job = Job("k", jobs_lifecycle.flaky, args=(counter, 5), reuse="never")
        with pytest.raises(JobFailed, match=r"^job 'k' failed: error: ValueError: attempt 1 failed$"):
            q.push_and_wait(job, timeout=WAIT)
        outcome = q.push(job)
        assert type(outcome) is InFlight and outcome.handle.done()
        assert isinstance(outcome.handle.state, Failed)
        with pytest.raises(JobFailed, match=r"^job 'k' failed: error: ValueError: attempt 1 failed$"):
            outcome.handle.result()
        with pytest.raises(JobFailed, match=r"attempt 1 failed"):
            q.push_and_wait(job, timeout=WAIT)
        assert jobs_lifecycle.attempts(counter) == 1
        ok = Job("c", jobs.identity, args=(3,), reuse="never")
        assert q.push_and_wait(ok, timeout=WAIT) == 3 and q.push(ok) == Cached(3)


def test_reuse_never_with_await() -> None:
    async def main(q: ProcQueue) -> None:
        with pytest.raises(JobFailed):
            await q.apush_and_wait(Job("k", jobs.boom, args=("x",)), timeout=WAIT)
        outcome = await q.apush(Job("k", jobs.boom, args=("x",)))
        assert type(outcome) is InFlight
        with pytest.raises(JobFailed, match=r"^job 'k' failed: error: ValueError: x$"):
            await outcome.handle

    with open_queue(1, reuse="never") as q:
        asyncio.run(main(q))


# --- the payload check ------------------------------------------------------------


def test_fingerprints_tell_function_and_arguments_apart() -> None:
    fp = fingerprint(jobs.identity, (1, "a", [1.5, None]), {"b": {"x": b"\0"}})
    assert len(fp) == 16
    assert fp == fingerprint(jobs.identity, (1, "a", [1.5, None]), {"b": {"x": b"\0"}})
    assert describe(fp, fingerprint(jobs.square, (1, "a", [1.5, None]), {"b": {"x": b"\0"}})) == "function"
    assert describe(fp, fingerprint(jobs.identity, (1.0, "a", [1.5, None]), {"b": {"x": b"\0"}})) == "arguments"
    assert describe(fp, fingerprint(jobs.identity, (True, "a", [1.5, None]), {"b": {"x": b"\0"}})) == "arguments"
    # dicts and sets compare by content, not by insertion order
    assert fingerprint(jobs.identity, ({"a": 1, "b": 2}, {3, 1}), None) == fingerprint(
        jobs.identity, ({"b": 2, "a": 1}, {1, 3}), None
    )
    # a partial is its function plus its bound arguments
    assert fingerprint(functools.partial(jobs.identity, 1), (), None) == fingerprint(jobs.identity, (1,), None)
    # lambdas on different lines are different functions
    f = lambda x: x  # noqa: E731
    g = lambda x: x  # noqa: E731
    assert describe(fingerprint(f, (), None), fingerprint(g, (), None)) == "function"


class Opaque:
    def __init__(self, n: int) -> None:
        self.n = n


def test_arguments_that_cannot_be_read_cheaply_fall_back_to_the_function() -> None:
    assert len(fingerprint(jobs.identity, (Opaque(1),), None)) == 8
    assert len(fingerprint(jobs.identity, (list(range(MAX_NODES + 1)),), None)) == 8
    assert len(fingerprint(jobs.identity, ({1: "int key"},), None)) == 8
    assert (
        describe(fingerprint(jobs.identity, (Opaque(1),), None), fingerprint(jobs.identity, (Opaque(2),), None)) is None
    )
    assert (
        describe(fingerprint(jobs.identity, (Opaque(1),), None), fingerprint(jobs.square, (Opaque(1),), None))
        == "function"
    )
    assert content_key(jobs.identity, Opaque(1)) != content_key(jobs.identity, Opaque(2))
    assert content_key(jobs.identity, 1).startswith("map:")


def test_a_live_key_pushed_with_other_work_raises_key_conflict(gates: Gates) -> None:
    gate = gates("held")
    with open_queue(1, on_mismatch="raise") as q:
        held = Job("k", jobs.signal_and_wait, args=(gate.started, gate.go))
        first = q.push(held)
        gate.wait_started()
        with pytest.raises(
            KeyConflict,
            match=r"^key 'k' is held by a job with other arguments to the same function, jobs.signal_and_wait\.",
        ) as info:
            q.push(Job("k", jobs.signal_and_wait, args=(gate.started, "elsewhere")))
        assert (info.value.key, info.value.differs) == ("k", "arguments")
        with pytest.raises(
            KeyConflict,
            match=r"^key 'k' is held by a job with another function: "
            r"this push runs jobs.getpid, the key's job jobs.signal_and_wait\.",
        ):
            q.push(Job("k", jobs.getpid))
        same = q.push(held)
        assert type(same) is InFlight
        gate.open()
        assert type(first) is Queued and same.handle.result(timeout=WAIT) == first.handle.result(timeout=WAIT)


def test_a_completed_key_pushed_with_other_work_raises_and_changes_nothing() -> None:
    with open_queue(1, on_mismatch="raise") as q:
        assert q.push_and_wait(Job("k", jobs.identity, args=(1,)), timeout=WAIT) == 1
        with pytest.raises(
            KeyConflict,
            match=r"^key 'k' is held by a job with another function: "
            r"this push runs jobs.square, the key's job a job that ended \(its function is not kept\)",
        ):
            q.push(Job("k", jobs.square, args=(1,)))
        with pytest.raises(KeyConflict, match=r"other arguments"):
            q.push_and_wait(Job("k", jobs.identity, args=(2,)))
        assert q.state("k") == Completed(1)
        assert q.push(Job("k", jobs.identity, args=(1,))) == Cached(1)
        # a failed key runs fresh work: its new payload is not a conflict
        with pytest.raises(JobFailed):
            q.push_and_wait(Job("f", jobs.boom), timeout=WAIT)
        assert q.push_and_wait(Job("f", jobs.identity, args=(2,)), timeout=WAIT) == 2


def test_on_mismatch_warn_warns_then_answers_as_the_key_says() -> None:
    with open_queue(1, on_mismatch="warn") as q:
        assert q.push_and_wait(Job("k", jobs.identity, args=(1,)), timeout=WAIT) == 1
        with pytest.warns(KeyConflictWarning, match=r"^key 'k' is held by a job with other arguments"):
            outcome = q.push(Job("k", jobs.identity, args=(2,)))
        assert outcome == Cached(1)


def test_on_mismatch_raise_is_the_default() -> None:
    with open_queue(1) as q:
        assert q.push_and_wait(Job("k", jobs.identity, args=(1,)), timeout=WAIT) == 1
        with pytest.raises(KeyConflict, match=r"^key 'k' is held by a job with another function"):
            q.push(Job("k", jobs.square, args=(7,)))
        assert q.push(Job("k", jobs.identity, args=(1,))) == Cached(1)


def test_on_mismatch_ignore_lets_the_key_alone_decide() -> None:
    with open_queue(1, on_mismatch="ignore") as q:
        assert q.push_and_wait(Job("k", jobs.identity, args=(1,)), timeout=WAIT) == 1
        assert q.push(Job("k", jobs.square, args=(7,))) == Cached(1)
