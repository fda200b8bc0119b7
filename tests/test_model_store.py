"""The key state machine on a SQLite store, checked against the same model
as the in-memory queue (test_model.py), with what only a store adds: the
queue closed and opened again on the file, and a second queue on the same
file completing keys that the first then answers from their rows.

Every push, outcome, state and count the model predicts for the in-memory
queue holds on a store too; and the model's keys outlive the queue."""

from __future__ import annotations

import os

import jobs_crashes
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import rule
from test_model import KEYS, LANE, WORKERS, Done, KeyMachine

from procq import Cached, Job, ProcQueue, Queued


class StoreKeyMachine(KeyMachine):
    def __init__(self) -> None:
        self.other: ProcQueue | None = None
        super().__init__()

    def open(self) -> ProcQueue:
        return ProcQueue(lanes={LANE: WORKERS}, on_mismatch="ignore", store=os.path.join(self.dir, "run.db"))

    def teardown(self) -> None:
        try:
            if self.other is not None:
                self.other.close(wait=False)
                assert self.other._worker_pids() == []
        finally:
            super().teardown()

    @rule()
    def reopen(self) -> None:
        """Close the queue and open it again on the same file (when no key is
        live: closing would cancel them): completed keys answer ``Cached``,
        failed ones read as failed, and the new queue's lane counts from zero."""
        if self.held:
            self.check_every_state()
            return
        self.q.close()
        assert self.q._worker_pids() == []
        self.q = self.open()
        self.lane_completed = self.lane_failed = self.crashes = 0
        self.check_every_state()

    @rule(key=st.sampled_from(KEYS))
    def complete_in_another_queue(self, key: str) -> None:
        """A second queue on the file runs a key that is not live in the first
        (or answers it from its row); the first then answers it from the row."""
        if key in self.held:
            self.check_state(key)
            return
        if self.other is None:
            self.other = ProcQueue(lanes={LANE: 1}, on_mismatch="ignore", store=os.path.join(self.dir, "run.db"))
        token = self.next_token(key)
        pushed = self.other.push(Job(key, jobs_crashes.model_job, args=("ok", token), lane=LANE))
        if self.completed(key):
            assert pushed == Cached(self.keys[key].value)  # type: ignore[union-attr]
        else:
            assert type(pushed) is Queued
            assert pushed.handle.result(timeout=20) == token
            self.keys[key] = Done("completed", token)
        self.check_state(key)


StoreKeyMachine.TestCase.settings = settings(
    max_examples=15,
    stateful_step_count=20,
    deadline=None,
    database=None,
)
TestStoreKeyMachine = StoreKeyMachine.TestCase
