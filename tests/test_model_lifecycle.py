"""The key lifecycle (retention + reuse policies + retries), checked against a
model with hypothesis.

Rules push keys with a reuse policy and a job that fails its first ``fails``
attempts under a ``Retry`` of ``attempts`` (backoff 0), advance the retention
clock, read states and forget keys. The model predicts every push outcome
(``Queued`` / ``Cached`` / a failed key's own failure under ``reuse="never"``),
every job's end (its output, or a failure after how many attempts), how many
attempts ran, which keys the queue holds (ttl, failed_ttl and the least
recently used beyond ``max_completed``) and the stats counters. Each pushed job
is waited for, so the model never races the engine; time is a test clock set
on the queue's core (``Core.clock``, see tests/test_retention.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

import jobs_lifecycle
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from procq import (
    Cached,
    Completed,
    Failed,
    InFlight,
    Job,
    JobFailed,
    ProcQueue,
    Queued,
    Retention,
    Retry,
)

KEYS = ("a", "b", "c", "d")
TTL, FAILED_TTL, MAX_COMPLETED = 10.0, 5.0, 2
WAIT = 20.0


@dataclass
class Rec:
    how: str  # "completed" | "failed"
    value: Any  # the output, or how many attempts ran
    at: float


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class LifecycleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="procq-lifecycle-")
        self.q = ProcQueue(
            1,
            retention=Retention(ttl=TTL, max_completed=MAX_COMPLETED, failed_ttl=FAILED_TTL),
            on_mismatch="ignore",  # the model pushes any job under any key
        )
        self.clock = Clock()
        self.q._core.clock = self.clock
        self.recs: dict[str, Rec] = {}
        self.lru: list[str] = []  # completed keys, least recently used first
        self.n = 0

    def teardown(self) -> None:
        try:
            self.q.close(wait=False)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # --- the model --------------------------------------------------------------

    def expire(self) -> None:
        now = self.clock.now
        for key, rec in list(self.recs.items()):
            limit = TTL if rec.how == "completed" else FAILED_TTL
            if now - rec.at >= limit:
                self.drop(key)

    def drop(self, key: str) -> None:
        del self.recs[key]
        if key in self.lru:
            self.lru.remove(key)

    def use(self, key: str) -> None:
        if key in self.lru:
            self.lru.remove(key)
            self.lru.append(key)

    def store(self, key: str, rec: Rec) -> None:
        if key in self.recs:
            self.drop(key)
        self.recs[key] = rec
        if rec.how == "completed":
            self.lru.append(key)
            while len(self.lru) > MAX_COMPLETED:
                del self.recs[self.lru.pop(0)]

    # --- rules --------------------------------------------------------------------

    @rule(
        key=st.sampled_from(KEYS),
        fails=st.integers(0, 3),
        attempts=st.integers(1, 3),
        reuse=st.sampled_from([None, "failed", "always", "never"]),
    )
    def push(self, key: str, fails: int, attempts: int, reuse: Any) -> None:
        self.n += 1
        token = f"{key}#{self.n}"
        counter = os.path.join(self.dir, token)
        retry = Retry(attempts=attempts, backoff=0) if attempts > 1 else None
        job = Job(key, jobs_lifecycle.flaky, args=(counter, fails, "raise", token), reuse=reuse, retry=retry)
        outcome = self.q.push(job)
        self.expire()
        rec = self.recs.get(key)
        policy = reuse or "failed"
        if rec is not None and rec.how == "completed" and policy != "always":
            assert outcome == Cached(rec.value)
            self.use(key)
            return
        if rec is not None and rec.how == "failed" and policy == "never":
            assert type(outcome) is InFlight and outcome.handle.done()
            with pytest.raises(JobFailed) as info:
                outcome.handle.result()
            assert info.value.failure.attempts == rec.value
            return
        assert type(outcome) is Queued
        if fails < attempts:
            assert outcome.handle.result(timeout=WAIT) == token
            self.store(key, Rec("completed", token, self.clock.now))
        else:
            with pytest.raises(JobFailed) as info:
                outcome.handle.result(timeout=WAIT)
            failure = info.value.failure
            history = attempts if attempts > 1 else 0
            assert (failure.kind, failure.attempts, len(failure.history)) == ("error", attempts, history)
            self.store(key, Rec("failed", attempts, self.clock.now))
        assert jobs_lifecycle.attempts(counter) == min(fails + 1, attempts)

    @rule(dt=st.sampled_from([1.0, 2.0, 5.0, 10.0]))
    def advance(self, dt: float) -> None:
        self.clock.now += dt

    @rule(key=st.sampled_from(KEYS))
    def read(self, key: str) -> None:
        state = self.q.state(key)
        self.expire()
        rec = self.recs.get(key)
        if rec is None:
            assert state is None
        elif rec.how == "completed":
            assert state == Completed(rec.value)
            self.use(key)
        else:
            assert isinstance(state, Failed) and state.failure.attempts == rec.value

    @rule(key=st.sampled_from(KEYS))
    def forget(self, key: str) -> None:
        forgotten = self.q.forget(key)
        self.expire()
        assert forgotten == (key in self.recs)
        if forgotten:
            self.drop(key)

    # --- invariants -----------------------------------------------------------------

    @invariant()
    def internal_invariants_hold(self) -> None:
        self.q._check_invariants()

    @invariant()
    def kept_keys_and_counts_match_the_model(self) -> None:
        stats = self.q.stats()
        self.expire()
        assert self.q.keys() == sorted(self.recs)
        assert stats.completed == sum(r.how == "completed" for r in self.recs.values())
        assert stats.failed == sum(r.how == "failed" for r in self.recs.values())
        assert (stats.pending, stats.processing) == (0, 0)


LifecycleMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=20,
    deadline=None,
    database=None,
)
TestLifecycleMachine = LifecycleMachine.TestCase
