"""Retention of ended keys (ttl, max_completed, failed_ttl), forget(), and the
enumeration of keys. Time is a test clock set on the queue's core
(``Core.clock``: stored times are read from it), so nothing here sleeps."""

from __future__ import annotations

import gc
import weakref
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
    Pending,
    Processing,
    ProcQueue,
    Queued,
    Retention,
)
from procq._core.entries import Entry, Face
from procq._core.retention import OUTPUT


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def install_test_clock(q: ProcQueue) -> Clock:
    """Set a test clock on the queue's retention bookkeeping and return it."""
    clock = Clock()
    q._core.clock = clock
    return clock


def complete_key(q: ProcQueue, key: str, value: Any = None) -> Any:
    """Run a job under ``key`` that returns ``value`` (by default the key) and wait for it."""
    return q.push_and_wait(Job(key, jobs.identity, args=(key if value is None else value,)), timeout=WAIT)


def fail_key(q: ProcQueue, key: str) -> None:
    """Run a job under ``key`` that raises, so the key ends failed."""
    with pytest.raises(JobFailed):
        q.push_and_wait(Job(key, jobs.boom, args=(key,)), timeout=WAIT)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"ttl": -1}, ValueError, r"^Retention ttl must be None or a number of seconds >= 0, got -1$"),
        ({"failed_ttl": "1"}, TypeError, r"^Retention failed_ttl must be a number of seconds or None, got str$"),
        ({"max_completed": -1}, ValueError, r"^Retention max_completed must be >= 0, got -1$"),
        ({"max_completed": 1.5}, TypeError, r"^Retention max_completed must be an int or None, got float$"),
    ],
)
def test_retention_rejects_bad_limits(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Retention(**kwargs)


def test_a_queue_takes_only_a_retention() -> None:
    with pytest.raises(TypeError, match=r"^retention must be a procq.Retention or None, got dict$"):
        ProcQueue(1, retention={"ttl": 1})  # type: ignore[arg-type]


def test_by_default_every_ended_key_is_kept() -> None:
    with open_queue(1) as q:
        clock = install_test_clock(q)
        complete_key(q, "a")
        fail_key(q, "b")
        clock.now += 10**9
        assert q.state("a") == Completed("a")
        assert isinstance(q.state("b"), Failed)
        assert q.push(Job("a", jobs.identity, args=("a",))) == Cached("a")


def test_a_completed_key_expires_after_its_ttl_and_then_runs_again(tmp_path: Any) -> None:
    counter = str(tmp_path / "runs")
    with open_queue(1, retention=Retention(ttl=10)) as q:
        clock = install_test_clock(q)
        job = Job("k", jobs_lifecycle.counted, args=(counter, "v"))
        assert q.push_and_wait(job, timeout=WAIT) == "v"
        clock.now += 9.5
        assert q.push(job) == Cached("v")
        assert q.stats().completed == 1
        clock.now += 0.5  # 10 s after it completed
        assert q.state("k") is None
        assert q.stats().completed == 0
        q._check_invariants()
        outcome = q.push(job)
        assert type(outcome) is Queued and outcome.handle.result(timeout=WAIT) == "v"
        assert jobs_lifecycle.attempts(counter) == 2


def test_expired_keys_are_reclaimed_without_being_read() -> None:
    with open_queue(1, retention=Retention(ttl=5, failed_ttl=5)) as q:
        clock = install_test_clock(q)
        for i in range(20):
            complete_key(q, f"k{i}")
        fail_key(q, "f")
        clock.now += 5
        complete_key(q, "fresh")  # any use of the map reclaims what expired
        assert len(q._core.records) == 1  # (a MemoryRecords)
        assert q.keys() == ["fresh"]


def test_beyond_max_completed_the_least_recently_used_key_goes() -> None:
    with open_queue(1, retention=Retention(max_completed=2)) as q:
        complete_key(q, "a")
        complete_key(q, "b")
        assert q.state("a") == Completed("a")  # a read is a use: b is now the oldest
        complete_key(q, "c")
        assert q.state("b") is None
        assert q.keys() == ["a", "c"]
        assert q.push(Job("a", jobs.identity, args=("a",))) == Cached("a")  # a use too
        complete_key(q, "d")
        assert q.keys() == ["a", "d"]
        assert q.stats().completed == 2


def test_max_completed_zero_keeps_no_output_but_the_handle_has_it() -> None:
    with open_queue(1, retention=Retention(max_completed=0)) as q:
        outcome = q.push(Job("k", jobs.identity, args=(5,)))
        assert type(outcome) is Queued and outcome.handle.result(timeout=WAIT) == 5
        assert q.state("k") is None and outcome.handle.state == Completed(5)


def test_a_kept_handle_does_not_keep_its_job_once_it_ended() -> None:
    # A program may keep thousands of handles: each keeps its key and outcome,
    # not the Job it was pushed with (its function, arguments and dict), so
    # those are freed with the program's last reference to the Job.
    with open_queue(1) as q:
        job = Job("k", jobs.identity, args=([1, 2, 3],))
        job_ref = weakref.ref(job)
        handle = q.push(job).handle
        assert handle.result(timeout=WAIT) == [1, 2, 3]
        del job
        assert job_ref() is None
        assert handle.key == "k" and handle.state == Completed([1, 2, 3]) and q.keys() == ["k"]
        assert q.push(Job("k", jobs.identity, args=([1, 2, 3],))) == Cached([1, 2, 3])


def test_kept_handles_of_completed_jobs_keep_no_entry_only_a_stand_in(gates: Gates) -> None:
    # What a push loop that keeps its handles leaves per completed job: the
    # handle and its stand-in, which holds the output (fewer objects for every
    # garbage collection to walk). The entries are freed as their jobs end; a
    # joiner's handle shares the stand-in.
    gate = gates("joined")
    with open_queue(2) as q:
        handles = [q.push(Job(f"k{i}", jobs.identity, args=(i,))).handle for i in range(50)]
        first = q.push(Job("j", jobs.signal_and_wait, args=(gate.started, gate.go)))
        gate.wait_started()
        joined = q.push(Job("j", jobs.signal_and_wait, args=(gate.started, gate.go)))
        gate.open()
        assert type(first) is Queued and type(joined) is InFlight
        assert [h.result(timeout=WAIT) for h in handles] == list(range(50))
        assert first.handle.result(timeout=WAIT) == joined.handle.result(timeout=WAIT) > 0
        keys = {f"k{i}" for i in range(50)} | {"j"}
        assert [o for o in gc.get_objects() if type(o) is Entry and o.key in keys] == []
        records = q._core.records
        assert all(type(h._held) is Face and records.peek(h.key)[OUTPUT] is h._held.output for h in handles)
        assert first.handle._held is joined.handle._held and type(first.handle._held) is Face
        assert [h.state for h in handles[:2]] == [Completed(0), Completed(1)] and all(h.done() for h in handles)
        assert handles[3].exception(timeout=0) is None and handles[3].cancel() is False


@pytest.mark.parametrize("retention", [None, Retention(ttl=3600), Retention(max_completed=100)])
def test_kept_keys_with_plain_outputs_are_nothing_for_the_garbage_collector_to_walk(
    retention: Retention | None,
) -> None:
    # A queue keeping many completed keys must not slow every full collection
    # (which stops every thread of the supervisor): once collected, a record
    # with a plain output, and the map of such records, are no longer tracked
    # by the collector. A record with an output it tracks stays tracked.
    with open_queue(2, retention=retention) as q:
        for outcome in q.push_all([Job(f"k{i}", jobs.identity, args=(i,)) for i in range(40)]):
            outcome.handle.result(timeout=WAIT)
        q.push(Job("s", jobs.identity, args=(("text", b"bytes", 1.5, None),))).handle.result(timeout=WAIT)
        q.push(Job("l", jobs.identity, args=([1, 2],))).handle.result(timeout=WAIT)
        gc.collect()
        gc.collect()  # (a tuple inside a tuple: one level each collection, as CPython untracks them)
        records = q._core.records
        plain = [records.peek(f"k{i}") for i in range(40)] + [records.peek("s")]
        assert [rec for rec in plain if rec is None or gc.is_tracked(rec)] == []
        assert gc.is_tracked(records.peek("l"))
        q.forget("l")
        gc.collect()
        assert not gc.is_tracked(records._records)
        assert q.push(Job("k7", jobs.identity, args=(7,))) == Cached(7)
        assert q.state("s") == Completed(("text", b"bytes", 1.5, None)) and len(q.keys()) == 41


@pytest.mark.parametrize("retention", [None, Retention(ttl=3600), Retention(max_completed=1)])
def test_a_handle_keeps_its_output_after_its_key_is_forgotten_evicted_or_run_again(
    retention: Retention | None,
) -> None:
    # A handle answers for the job it was given for, whatever its key's record
    # becomes: forgotten, evicted (a dropped record under a ttl lets go of its
    # output), or replaced by a later job of the key.
    with open_queue(1, retention=retention) as q:
        old = q.push(Job("k", jobs.identity, args=("first",))).handle
        assert old.result(timeout=WAIT) == "first"
        complete_key(q, "other")  # evicts "k" under max_completed=1
        q.forget("k")
        assert old.result(timeout=0) == "first" and old.state == Completed("first")
        new = q.push(Job("k", jobs.identity, args=("second",))).handle
        assert new.result(timeout=WAIT) == "second"
        q.forget("k")
        assert (old.result(timeout=0), new.result(timeout=0)) == ("first", "second")
        assert repr(old) == "<JobHandle key='k' state=Completed(output='first')>"


def test_a_failed_record_is_kept_for_failed_ttl_and_stays_retryable() -> None:
    with open_queue(1, retention=Retention(failed_ttl=30)) as q:
        clock = install_test_clock(q)
        fail_key(q, "f")
        clock.now += 29
        state = q.state("f")
        assert isinstance(state, Failed) and state.failure.kind == "error"
        assert q.push_and_wait(Job("f", jobs.identity, args=(1,)), timeout=WAIT) == 1  # retryable
        fail_key(q, "g")
        clock.now += 30
        assert q.state("g") is None
        assert q.stats().failed == 0
        assert q.state("f") == Completed(1)  # completed keys have no ttl here


def test_an_abandoned_claim_gives_back_a_record_unless_it_expired_meanwhile() -> None:
    with open_queue({"w": 1}, retention=Retention(failed_ttl=10)) as q:
        clock = install_test_clock(q)
        fail_key(q, "f")
        core = q._core
        kind, entry, _ = core.claim(Job("f", jobs.identity, args=(1,)), core.default_lane)
        assert kind == "queued" and q.state("f") == Pending()
        core.abandon(entry, "test")
        assert isinstance(q.state("f"), Failed)
        kind, entry, _ = core.claim(Job("f", jobs.identity, args=(1,)), core.default_lane)
        clock.now += 10
        core.abandon(entry, "test")
        assert q.state("f") is None
        q._check_invariants()


def test_forget_drops_an_ended_key_and_refuses_a_live_one(gates: Gates) -> None:
    gate = gates("live")
    with open_queue(1) as q:
        complete_key(q, "done")
        fail_key(q, "failed")
        assert q.forget("done") is True and q.state("done") is None
        assert q.forget("failed") is True and q.state("failed") is None
        assert q.forget("never") is False
        outcome = q.push(Job("live", jobs.signal_and_wait, args=(gate.started, gate.go)))
        gate.wait_started()
        with pytest.raises(
            ValueError, match=r"^cannot forget key 'live': it is live \(running\); only a key that ended"
        ):
            q.forget("live")
        assert q.state("live") == Processing()
        gate.open()
        assert type(outcome) is Queued and outcome.handle.result(timeout=WAIT) > 0
        with pytest.raises(TypeError, match=r"^a key is a str, got int: 3$"):
            q.forget(3)  # type: ignore[arg-type]
        assert q.stats().completed == 1 and q.stats().failed == 0


def test_keys_and_handles_list_every_key_with_its_state(gates: Gates) -> None:
    gate = gates("shard")
    with open_queue(1) as q:
        complete_key(q, "shard:1")
        fail_key(q, "shard:2")
        complete_key(q, "other")
        live = q.push(Job("shard:3", jobs.signal_and_wait, args=(gate.started, gate.go)))
        gate.wait_started()
        waiting = q.push(Job("shard:4", jobs.identity, args=(4,)))
        assert q.keys() == ["other", "shard:1", "shard:2", "shard:3", "shard:4"]
        assert q.keys(prefix="shard:") == ["shard:1", "shard:2", "shard:3", "shard:4"]
        assert q.keys(prefix="shard:", state=Completed) == ["shard:1"]
        assert q.keys(state=(Pending, Processing)) == ["shard:3", "shard:4"]
        handles = {h.key: h for h in q.handles(prefix="shard:")}
        assert handles["shard:1"].state == Completed("shard:1") and handles["shard:1"].result() == "shard:1"
        assert handles["shard:2"].done()
        with pytest.raises(JobFailed, match=r"^job 'shard:2' failed: error: ValueError: shard:2$"):
            handles["shard:2"].result()
        assert handles["shard:3"].state == Processing() and handles["shard:4"].state == Pending()
        assert not all(h.done() for h in handles.values())  # "is every shard caught up?": not yet
        gate.open()
        assert type(live) is Queued and type(waiting) is Queued
        assert handles["shard:4"].result(timeout=WAIT) == 4 and handles["shard:3"].result(timeout=WAIT) > 0
        assert all(h.done() for h in q.handles(prefix="shard:"))
        with pytest.raises(TypeError, match=r"^state must be Pending, Processing, Completed or Failed"):
            q.keys(state="completed")
        with pytest.raises(TypeError, match=r"^prefix must be a str or None, got int$"):
            q.handles(prefix=1)  # type: ignore[arg-type]


def test_enumeration_leaves_out_expired_keys() -> None:
    with open_queue(1, retention=Retention(ttl=5)) as q:
        clock = install_test_clock(q)
        complete_key(q, "a")
        clock.now += 3
        complete_key(q, "b")
        clock.now += 2
        assert q.keys() == ["b"] and [h.key for h in q.handles()] == ["b"]
        q._check_invariants()
