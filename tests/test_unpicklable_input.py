"""Input that cannot be pickled at push loses nothing: push raises (a TypeError that is also a
PicklingError), a new key stays absent, a failed key keeps its failure, and pushes that joined
the claim are woken cancelled."""

from __future__ import annotations

import functools
import pickle
import threading
from typing import Any

import jobs
import jobs_core
import pytest
from core_support import WAIT, OnPickle, read_log

import procq
import procq._api.queue
from procq import Failed, InFlight, Job, JobFailed, ProcQueue, Queued


def test_an_unpicklable_argument_raises_type_error_and_leaves_a_new_key_absent(queue: ProcQueue, log: str) -> None:
    lock = threading.Lock()
    with pytest.raises(
        TypeError, match=r"^job 'k': its arguments could not be pickled: cannot pickle '_thread\.lock' object$"
    ) as info:
        queue.push(Job("k", jobs.identity, args=(lock,)))
    assert info.value.__cause__ is not None
    assert queue.state("k") is None
    with pytest.raises(TypeError, match=r"^job 'k': its arguments could not be pickled: "):
        queue.push(Job("k", jobs.identity, kwargs={"x": lock}))
    with pytest.raises(TypeError, match=r"^job 'k': its arguments could not be pickled: "):
        queue.push_and_wait(Job("k", jobs.identity, args=(lock,)), timeout=WAIT)
    assert queue.state("k") is None
    assert queue.stats().pending == 0
    # The key is free: a good job under it runs.
    assert type(queue.push(Job("k", jobs_core.record, args=(log,)))) is Queued
    pid = queue.push_and_wait(Job("k", jobs_core.record, args=(log,)), timeout=WAIT)
    assert read_log(log) == [f"ran {pid}"]


def test_an_unpicklable_function_raises_type_error_and_leaves_a_new_key_absent(queue: ProcQueue) -> None:
    lock = threading.Lock()
    closure = lambda: lock  # noqa: E731 - a closure over something that cannot be pickled
    with pytest.raises(
        TypeError,
        match=r"^job 'k': its function <function .*<lambda>.* could not be pickled: "
        r"cannot pickle '_thread\.lock' object$",
    ):
        queue.push(Job("k", closure))
    assert queue.state("k") is None
    partial = functools.partial(jobs.identity, lock)
    with pytest.raises(TypeError, match=r"^job 'k': its function functools\.partial\(.* could not be pickled: "):
        queue.push(Job("k", partial))
    assert queue.state("k") is None
    assert queue.push_and_wait(Job("k", jobs.square, args=(9,)), timeout=WAIT) == 81


def test_unpicklable_input_leaves_a_failed_key_failed_with_the_same_failure(queue: ProcQueue) -> None:
    with pytest.raises(JobFailed, match="earlier failure"):
        queue.push_and_wait(Job("k", jobs.boom, args=("earlier failure",)), timeout=WAIT)
    before = queue.state("k")
    assert isinstance(before, Failed)
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"^job 'k': its arguments could not be pickled: "):
        queue.push(Job("k", jobs.identity, args=(lock,)))
    assert queue.state("k") == before
    with pytest.raises(TypeError, match=r"^job 'k': its function .* could not be pickled: "):
        queue.push(Job("k", lambda: lock))
    after = queue.state("k")
    assert after == before
    assert isinstance(after, Failed) and after.failure.message == "ValueError: earlier failure"
    assert queue.stats().failed == 1
    assert type(queue.push(Job("k", jobs.square, args=(5,)))) is Queued


@pytest.mark.key_decides  # pushes other work under a held key on purpose: on_mismatch="ignore"
def test_a_push_joined_to_a_claim_that_fails_to_pickle_is_woken_cancelled(queue: ProcQueue) -> None:
    joined: dict[str, Any] = {}

    def join() -> None:  # runs in the first push, while it holds the claim
        thread = threading.Thread(target=lambda: joined.update(outcome=queue.push(Job("k", jobs.getpid))))
        thread.start()
        thread.join(WAIT)

    with pytest.raises(TypeError, match=r"^job 'k': its arguments could not be pickled: "):
        queue.push(Job("k", jobs.identity, args=(OnPickle(join), threading.Lock())))
    outcome = joined["outcome"]
    assert type(outcome) is InFlight
    with pytest.raises(
        JobFailed,
        match=r"^job 'k' failed: cancelled: job 'k' was abandoned before it ran: "
        r"its function or arguments could not be pickled$",
    ) as info:
        outcome.handle.result(timeout=WAIT)
    assert info.value.failure.kind == "cancelled"
    assert queue.state("k") is None


def test_an_unpicklable_argument_is_both_a_type_error_and_a_pickling_error(queue: ProcQueue) -> None:
    job = Job("lock", jobs.identity, args=(threading.Lock(),))
    with pytest.raises(procq.JobPicklingError, match=r"^job 'lock': its arguments could not be pickled: ") as info:
        queue.push(job)
    assert isinstance(info.value, TypeError) and isinstance(info.value, pickle.PicklingError)
    assert queue.state("lock") is None
