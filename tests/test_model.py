"""The key state machine, checked against a model with hypothesis.

Rules push keys (from a small set) whose jobs return, raise or crash, either
running at once or held at a FIFO gate, call ``push_and_wait``, release held
jobs and read ``state()``. The model predicts every push outcome (``Queued`` /
``InFlight`` / ``Cached``), every job's end (``Completed`` output or ``Failed``
kind, the same for every handle that joined it), every state and the
``stats()`` counters. Held jobs are what make ``InFlight``, ``Pending`` and
``Processing`` deterministic: a held job stays where the model says until the
machine releases it, and a job predicted to start is waited for on its gate.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

import jobs
import jobs_crashes
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
    Pending,
    Processing,
    ProcQueue,
    Queued,
)

WORKERS = 2
LANE = "work"
KEYS = ("a", "b", "c", "d")
# Crashes cost a worker restart each: one fresh job in eight.
BEHAVIOURS = ("ok", "ok", "ok", "ok", "ok", "raise", "raise", "crash")


@dataclass
class Live:
    """A key whose job has not ended: held at a gate, running or waiting for a worker."""

    behaviour: str
    token: str
    started: str
    go: str
    running: bool
    handles: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class Done:
    """A key whose job ended: ``("completed", output)`` or ``("failed", kind)``."""

    how: str
    value: Any


class KeyMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="procq-model-")
        self.fds: list[int] = []
        self.q = self.open()
        self.keys: dict[str, Live | Done] = {}
        self.held: list[str] = []  # live keys in push order: the lane runs them in this order
        self.n = 0
        self.lane_completed = 0  # job endings, as the lane counts them
        self.lane_failed = 0
        self.crashes = 0

    def open(self) -> ProcQueue:
        return ProcQueue(lanes={LANE: WORKERS}, on_mismatch="ignore")  # the model pushes any job under any key

    def teardown(self) -> None:
        try:
            self.q.close(wait=False)
            assert self.q._worker_pids() == []
        finally:
            for fd in self.fds:
                os.close(fd)
            shutil.rmtree(self.dir, ignore_errors=True)

    # --- the model's helpers -----------------------------------------------------------

    def completed(self, key: str) -> bool:
        current = self.keys.get(key)
        return isinstance(current, Done) and current.how == "completed"

    def live(self) -> list[Live]:
        """The live keys' models, in push order."""
        found = [self.keys[k] for k in self.held]
        assert all(isinstance(v, Live) for v in found)
        return found  # type: ignore[return-value]

    def running(self) -> int:
        return sum(1 for v in self.live() if v.running)

    def free_workers(self) -> int:
        return WORKERS - self.running()

    def next_token(self, key: str) -> str:
        self.n += 1
        return f"{key}#{self.n}"

    def job(self, key: str, behaviour: str, token: str, gate: tuple[str, str] | None = None) -> Job[str]:
        args: tuple[Any, ...] = (behaviour, token) if gate is None else (behaviour, token, *gate)
        return Job(key, jobs_crashes.model_job, args=args, lane=LANE)

    def check_outcome(self, key: str, behaviour: str, token: str, handles: list[Any]) -> None:
        """Every handle on the job sees the ending its behaviour predicts; record it."""
        if behaviour == "ok":
            for h in handles:
                assert h.result(timeout=20) == token
            self.keys[key] = Done("completed", token)
            self.lane_completed += 1
            return
        failures = []
        for h in handles:
            with pytest.raises(JobFailed) as info:
                h.result(timeout=20)
            assert info.value.key == key
            failures.append(info.value.failure)
        assert all(f == failures[0] for f in failures)
        failure = failures[0]
        if behaviour == "raise":
            assert (failure.kind, failure.exc_type, failure.message) == ("error", "ValueError", f"ValueError: {token}")
        else:
            assert (failure.kind, failure.exitcode, failure.signal) == ("crashed", 5, None)
            self.crashes += 1
        self.keys[key] = Done("failed", failure.kind)
        self.lane_failed += 1

    def push_expecting(self, key: str, outcome: Any) -> bool:
        """Check a push of ``key`` against the model. True: it queued fresh work."""
        current = self.keys.get(key)
        if isinstance(current, Live):
            assert type(outcome) is InFlight and outcome.handle.key == key
            current.handles.append(outcome.handle)
            return False
        if isinstance(current, Done) and current.how == "completed":
            assert outcome == Cached(current.value)
            return False
        assert type(outcome) is Queued and outcome.handle.key == key  # new, or failed before
        return True

    def start_next_waiting(self) -> None:
        """A worker came free: the first waiting held job now starts on it."""
        for key in self.held:
            live = self.keys[key]
            assert isinstance(live, Live)
            if not live.running:
                self.wait_started(key, live)
                return

    def wait_started(self, key: str, live: Live) -> None:
        pid = int(jobs.wait_signal(live.started, timeout=20))
        assert pid in self.q._worker_pids()
        live.running = True

    # --- rules ---------------------------------------------------------------------
    #
    # Every rule is always enabled (hypothesis aborts examples when it cannot
    # find an enabled rule quickly); a rule with nothing to act on checks every
    # key's state instead.

    @rule(key=st.sampled_from(KEYS), behaviour=st.sampled_from(BEHAVIOURS), hold=st.booleans())
    def push(self, key: str, behaviour: str, hold: bool) -> None:
        """Push a job. Fresh work runs at once and is waited for, or is held at
        a gate (always, when no worker is free): it then runs if a worker is
        free, else waits in the lane."""
        token = self.next_token(key)
        free = self.free_workers()
        hold = hold or free == 0
        gate = (jobs.fifo(self.dir, f"{token}-started"), jobs.fifo(self.dir, f"{token}-go")) if hold else None
        outcome = self.q.push(self.job(key, behaviour, token, gate))
        if not self.push_expecting(key, outcome):
            return
        if gate is None:
            self.check_outcome(key, behaviour, token, [outcome.handle])
            return
        live = Live(behaviour, token, *gate, running=False, handles=[outcome.handle])
        self.keys[key] = live
        self.held.append(key)
        if free > 0:
            self.wait_started(key, live)

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        """Let a running held job go: it ends, and every handle on it sees that."""
        running = [k for k, v in zip(self.held, self.live(), strict=True) if v.running]
        if not running:
            self.check_every_state()
            return
        key = data.draw(st.sampled_from(running))
        live = self.keys[key]
        assert isinstance(live, Live)
        self.fds.append(jobs.release(live.go))
        self.held.remove(key)
        self.check_outcome(key, live.behaviour, live.token, live.handles)
        self.start_next_waiting()

    @rule(data=st.data(), behaviour=st.sampled_from(BEHAVIOURS))
    def push_and_wait(self, data: st.DataObject, behaviour: str) -> None:
        """push_and_wait a key that will not block: a completed one, or any key
        not in flight while a worker is free."""
        free = self.free_workers() > 0
        candidates = [k for k in KEYS if not isinstance(self.keys.get(k), Live) and (free or self.completed(k))]
        if not candidates:
            self.check_every_state()
            return
        key = data.draw(st.sampled_from(candidates))
        token = self.next_token(key)
        current = self.keys.get(key)
        job = self.job(key, behaviour, token)
        if isinstance(current, Done) and current.how == "completed":
            assert self.q.push_and_wait(job, timeout=20) == current.value
            return
        if behaviour == "ok":
            assert self.q.push_and_wait(job, timeout=20) == token
            self.keys[key] = Done("completed", token)
            self.lane_completed += 1
            return
        kind = "error" if behaviour == "raise" else "crashed"
        with pytest.raises(JobFailed, match=rf"^job '{key}' failed: {kind}: "):
            self.q.push_and_wait(job, timeout=20)
        self.crashes += behaviour == "crash"
        self.keys[key] = Done("failed", kind)
        self.lane_failed += 1

    @rule(key=st.sampled_from(KEYS))
    def query(self, key: str) -> None:
        self.check_state(key)

    def check_every_state(self) -> None:
        for key in KEYS:
            self.check_state(key)

    def check_state(self, key: str) -> None:
        state = self.q.state(key)
        current = self.keys.get(key)
        if current is None:
            assert state is None
        elif isinstance(current, Live):
            assert state == (Processing() if current.running else Pending())
            assert all(h.state == state and not h.done() for h in current.handles)
        elif current.how == "completed":
            assert state == Completed(current.value)
        else:
            assert isinstance(state, Failed) and state.failure.kind == current.value

    # --- invariants -----------------------------------------------------------------

    @invariant()
    def internal_invariants_hold(self) -> None:
        self.q._check_invariants()

    @invariant()
    def stats_match_the_model(self) -> None:
        stats = self.q.stats()
        live = self.live()
        done = [v for v in self.keys.values() if isinstance(v, Done)]
        running = self.running()
        assert (stats.pending, stats.processing) == (len(live) - running, running)
        assert stats.completed == sum(1 for v in done if v.how == "completed")
        assert stats.failed == sum(1 for v in done if v.how == "failed")
        lane = stats.lanes[LANE]
        assert (lane.waiting, lane.running) == (len(live) - running, running)
        assert (lane.completed, lane.failed, lane.crashes) == (self.lane_completed, self.lane_failed, self.crashes)
        # A crashed worker leaves the lane before its job's waiters wake, and its
        # replacement joins just after: at most the latest one may still be on its way.
        assert lane.worker_restarts in (self.crashes - 1, self.crashes) if self.crashes else lane.worker_restarts == 0
        assert lane.workers_alive == WORKERS - self.crashes + lane.worker_restarts


KeyMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=20,
    deadline=None,
    database=None,
)
TestKeyMachine = KeyMachine.TestCase
