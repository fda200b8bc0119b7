"""The public surface: names, argument checking, bad input at push, lambdas and
closures, closing, Failure and JobFailed, push_and_wait."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import os
import pickle
import threading
from typing import Any, Callable

import jobs
import jobs_core
import psutil
import pytest
from core_support import WAIT, BlockingCall, Gates, OnPickle, open_queue, read_log
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import procq
import procq._push
from procq import (
    Cached,
    Completed,
    Failed,
    Failure,
    InFlight,
    Job,
    JobFailed,
    Lane,
    Pending,
    Processing,
    ProcQueue,
    ProcQueueError,
    QueueClosed,
    Queued,
)

# --- names --------------------------------------------------------------------------


def test_all_is_sorted_unique_and_importable() -> None:
    names = procq.__all__
    assert names == sorted(names)
    assert len(set(names)) == len(names)
    namespace: dict[str, Any] = {}
    exec("from procq import *", namespace)
    for name in names:
        assert namespace[name] is getattr(procq, name)
    contract = {
        "ProcQueue", "Job", "Lane", "Queued", "Cached", "InFlight", "Pending", "Processing",
        "Completed", "Failed", "Failure", "JobFailed", "JobHandle", "ProcQueueError", "LaneFull",
        "QueueClosed",
    }  # fmt: skip
    assert contract <= set(names)


def test_the_error_tree() -> None:
    assert issubclass(procq.LaneFull, ProcQueueError) and issubclass(procq.LaneFull, TimeoutError)
    assert issubclass(QueueClosed, ProcQueueError)
    assert issubclass(JobFailed, Exception) and not issubclass(JobFailed, ProcQueueError)


# --- bad arguments raise at once ------------------------------------------------------------


def f() -> None:
    """A module-level function to build jobs with."""


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: Job(1, f), TypeError, r"^job key must be a str, got int: 1$"),  # type: ignore[arg-type]
        (lambda: Job(b"k", f), TypeError, r"^job key must be a str, got bytes: b'k'$"),  # type: ignore[arg-type]
        (lambda: Job(None, f), TypeError, r"^job key must be a str, got NoneType: None$"),  # type: ignore[arg-type]
        (lambda: Job("", f), ValueError, r"^job key must be a non-empty str$"),
        (lambda: Job("k", 3), TypeError, r"^job 'k': fn must be callable, got int: 3$"),  # type: ignore[arg-type]
        (lambda: Job("k", "f"), TypeError, r"^job 'k': fn must be callable, got str: 'f'$"),  # type: ignore[arg-type]
        (lambda: Job("k", f, args="ab"), TypeError, r"^job 'k': args must be a tuple or list, got str$"),
        (lambda: Job("k", f, args=1), TypeError, r"^job 'k': args must be a tuple or list, got int$"),  # type: ignore[arg-type]
        (lambda: Job("k", f, kwargs=[1]), TypeError, r"^job 'k': kwargs must be a mapping or None, got list$"),  # type: ignore[arg-type]
        (lambda: Job("k", f, kwargs={1: 2}), TypeError, r"^job 'k': kwargs keys must be str, got 1$"),  # type: ignore[dict-item]
        (lambda: Job("k", f, lane=1), TypeError, r"^job 'k': lane must be a str or None, got int$"),  # type: ignore[arg-type]
        (
            lambda: Job("k", f, timeout="1"),  # type: ignore[arg-type]
            TypeError,
            r"^job 'k': timeout must be a number of seconds or None, got str$",
        ),
        (
            lambda: Job("k", f, timeout=True),
            TypeError,
            r"^job 'k': timeout must be a number of seconds or None, got bool$",
        ),
        (lambda: Job("k", f, timeout=0), ValueError, r"^job 'k': timeout must be a positive number of seconds, got 0$"),
        (lambda: Job("k", f, timeout=-1.5), ValueError, r"^job 'k': timeout must be a positive number of seconds, got -1\.5$"),
        (lambda: Job("k", f, timeout=math.nan), ValueError, r"^job 'k': timeout must be a positive number of seconds, got nan$"),
        (lambda: Job("k", f, timeout=math.inf), ValueError, r"^job 'k': timeout must be a positive number of seconds, got inf$"),
        (lambda: Lane(workers=0), ValueError, r"^a lane needs at least 1 worker, got 0$"),
        (lambda: Lane(workers=-2), ValueError, r"^a lane needs at least 1 worker, got -2$"),
        (lambda: Lane(workers=1.5), TypeError, r"^lane workers must be an int, got float$"),  # type: ignore[arg-type]
        (lambda: Lane(capacity=-1), ValueError, r"^a lane's capacity must be 0 or more, got -1$"),
        (lambda: Lane(capacity=None), TypeError, r"^lane capacity must be an int, got NoneType$"),  # type: ignore[arg-type]
        (lambda: ProcQueue(lanes=0), ValueError, r"^lanes=0: a queue needs at least 1 worker$"),
        (lambda: ProcQueue(lanes=-3), ValueError, r"^lanes=-3: a queue needs at least 1 worker$"),
        (lambda: ProcQueue(lanes={}), ValueError, r"^lanes must name at least one lane$"),
        (lambda: ProcQueue(lanes={"io": 0}), ValueError, r"^lane 'io' needs at least 1 worker, got 0$"),
        (
            lambda: ProcQueue(lanes={"io": "2"}),  # type: ignore[dict-item]
            TypeError,
            r"^lane 'io': expected an int or a Lane, got str$",
        ),
        (lambda: ProcQueue(lanes={"": 1}), TypeError, r"^lane names must be non-empty str, got ''$"),
        (
            lambda: ProcQueue(lanes="cpu"),  # type: ignore[arg-type]
            TypeError,
            r"^lanes must be an int or a mapping of lane names to int or Lane, got str$",
        ),
        (
            lambda: ProcQueue(lanes=True),
            TypeError,
            r"^lanes must be an int or a mapping of lane names to int or Lane, got bool$",
        ),
        (
            lambda: ProcQueue(lanes=1, start_method="fork"),
            ValueError,
            r"^start method 'fork' is not supported: the supervisor runs a thread",
        ),
        (
            lambda: ProcQueue(lanes=1, start_method="bogus"),
            ValueError,
            r"^unknown start method 'bogus'; this platform has .*forkserver",
        ),
    ],
)
def test_bad_arguments_raise_at_once(make: Callable[[], Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        make()


def test_a_key_that_is_a_str_subclass_is_kept_as_a_plain_str() -> None:
    class Key(str):
        pass

    key = Job(Key("k"), f).key
    assert key == "k" and type(key) is str


def test_stats_read_as_attributes_items_and_a_dict(queue: ProcQueue) -> None:
    assert queue.push_and_wait(Job("s", jobs.square, args=(3,), lane="io"), timeout=WAIT) == 9
    stats = queue.stats()
    assert stats.completed == stats["completed"] == 1
    assert stats.lanes["io"].completed == stats["lanes"]["io"]["completed"] == 1
    assert stats["lanes"]["cpu"]["workers"] == 2
    with pytest.raises(KeyError):
        stats["nothing"]
    as_dict = stats.to_dict()
    assert as_dict["completed"] == 1 and as_dict["lanes"]["io"]["name"] == "io"
    assert as_dict["lanes"]["io"]["workers"] == 1 and as_dict["lanes"]["cpu"]["capacity"] == 1024


def test_a_job_is_a_frozen_value() -> None:
    job = Job("k", jobs.square, args=[3], kwargs={"x": 1}, lane="cpu", timeout=2)
    assert (job.key, job.fn, job.args, job.kwargs, job.lane, job.timeout) == ("k", jobs.square, (3,), {"x": 1}, "cpu", 2.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.key = "other"  # type: ignore[misc]
    assert job == Job("k", jobs.square, args=(3,), kwargs={"x": 1}, lane="cpu", timeout=2.0)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.text(min_size=1))
def test_any_nonempty_str_is_a_key(key: str) -> None:
    assert Job(key, f).key == key


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.one_of(st.integers(), st.binary(), st.floats(), st.none(), st.lists(st.text()), st.tuples(st.text())))
def test_a_key_that_is_not_a_str_is_refused(key: Any) -> None:
    with pytest.raises(TypeError, match=r"^job key must be a str, got "):
        Job(key, f)


def test_push_refuses_bad_arguments_at_once_and_claims_nothing(queue: ProcQueue) -> None:
    with pytest.raises(ValueError, match=r"^job 'k': unknown lane 'gpu'; this queue's lanes are 'cpu', 'io'$"):
        queue.push(Job("k", jobs.getpid, lane="gpu"))
    with pytest.raises(ValueError, match=r"^job 'k': unknown lane 'gpu'; this queue's lanes are 'cpu', 'io'$"):
        queue.push_and_wait(Job("k", jobs.getpid, lane="gpu"))
    with pytest.raises(TypeError, match=r"^push\(\) takes a procq\.Job, got tuple$"):
        queue.push(("k", jobs.getpid))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^push\(\) takes a procq\.Job, got function$"):
        queue.push_and_wait(jobs.getpid)  # type: ignore[arg-type]

    async def main() -> None:
        with pytest.raises(ValueError, match=r"^job 'k': unknown lane 'gpu'"):
            await queue.apush(Job("k", jobs.getpid, lane="gpu"))
        with pytest.raises(TypeError, match=r"^push\(\) takes a procq\.Job, got str$"):
            await queue.apush("k")  # type: ignore[arg-type]

    asyncio.run(main())
    assert queue.state("k") is None
    stats = queue.stats()
    assert (stats.pending, stats.processing, stats.completed, stats.failed) == (0, 0, 0, 0)


@pytest.mark.parametrize("timeout", ["soon", [1]])
def test_push_refuses_a_timeout_that_is_not_a_number(queue: ProcQueue, timeout: Any) -> None:
    # A bad argument raises at once (contract section 3), even when the lane has room.
    with pytest.raises(TypeError, match="timeout"):
        queue.push(Job("k", jobs.getpid), timeout=timeout)
    assert queue.state("k") is None


# --- bad input at push loses nothing -----------------------------------------------------


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
        TypeError, match=r"^job 'k': its function <function .*<lambda>.* could not be pickled: cannot pickle '_thread\.lock' object$"
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


# --- lambdas and closures ------------------------------------------------------------------


def make_adder(n: int) -> Callable[[int], int]:
    def add(x: int) -> int:
        return x + n

    return add


def test_lambdas_closures_and_local_functions_run_in_a_child(start_method: str) -> None:
    me = os.getpid()
    scale = 3

    def local(x: int) -> tuple[int, int]:
        return x * scale, os.getpid()

    with open_queue({"main": 1}, start_method=start_method) as q:
        value, pid = q.push_and_wait(Job("lambda", lambda x: (x * 3, os.getpid()), args=(4,)), timeout=WAIT)
        assert value == 12 and pid != me
        assert q.push_and_wait(Job("local", local, args=(5,)), timeout=WAIT) == (15, pid)
        assert q.push_and_wait(Job("closure-1", make_adder(1), args=(10,)), timeout=WAIT) == 11
        assert q.push_and_wait(Job("closure-2", make_adder(2), args=(10,)), timeout=WAIT) == 12
        # As arguments: a lambda and a local function travel by value too.
        assert q.push_and_wait(Job("arg-lambda", jobs_core.apply, args=(lambda v: v * 2, 21)), timeout=WAIT) == (42, pid)
        assert q.push_and_wait(Job("arg-local", jobs_core.apply, args=(local, 2)), timeout=WAIT) == ((6, pid), pid)
        assert q.push_and_wait(Job("closure-kwargs", make_adder(100), kwargs={"x": 1}), timeout=WAIT) == 101
        assert q.push_and_wait(Job("lambda-kwargs", lambda *, a, b: a - b, kwargs={"a": 10, "b": 3}), timeout=WAIT) == 7


def test_many_distinct_closures_in_one_worker_each_run_their_own_code() -> None:
    # More distinct functions than a worker keeps unpickled, twice over, in one
    # worker: each job must run its own function, never a cached neighbour's.
    adders = [make_adder(n) for n in range(150)]
    with open_queue(1) as q:
        handles = [q.push(Job(f"add-{n}", fn, args=(1000,))).handle for n, fn in enumerate(adders)]
        handles += [q.push(Job(f"again-{n}", fn, args=(2000,))).handle for n, fn in enumerate(adders)]
        results = [h.result(timeout=WAIT) for h in handles]
    assert results == [1000 + n for n in range(150)] + [2000 + n for n in range(150)]


@pytest.mark.parametrize("change", ["rebound", "mutated"])
def test_a_function_runs_with_the_values_it_has_when_pushed(queue: ProcQueue, change: str) -> None:
    # As with concurrent.futures: what runs is fn as it is at push time. A
    # closure whose captured variable was rebound, or whose captured object was
    # changed, must not run with the values of an earlier push.
    n = 0
    items: list[int] = []

    def current() -> int:
        return n if change == "rebound" else sum(items)

    seen = []
    for i in range(3):
        if change == "rebound":
            n = i
        else:
            items.append(i)
        expected = current()
        seen.append((expected, queue.push_and_wait(Job(f"current-{i}", current), timeout=WAIT)))
    assert [got for _, got in seen] == [want for want, _ in seen]


# --- closing --------------------------------------------------------------------------------


def test_push_after_close_raises_queue_closed_and_close_is_idempotent(log: str) -> None:
    q = ProcQueue(lanes=1)
    try:
        pid = q.push_and_wait(Job("done", jobs_core.record, args=(log,)), timeout=WAIT)
        q.close()
        assert q.closed
        assert q._worker_pids() == []
        with pytest.raises(QueueClosed, match=r"^the queue is closed; cannot push job 'new'$") as info:
            q.push(Job("new", jobs.getpid))
        assert isinstance(info.value, ProcQueueError)
        with pytest.raises(QueueClosed, match=r"^the queue is closed; cannot push job 'done'$"):
            q.push(Job("done", jobs.getpid))
        with pytest.raises(QueueClosed, match=r"^the queue is closed; cannot push job 'new'$"):
            q.push_and_wait(Job("new", jobs.getpid), timeout=WAIT)

        async def main() -> None:
            with pytest.raises(QueueClosed, match=r"^the queue is closed; cannot push job 'new'$"):
                await q.apush(Job("new", jobs.getpid))
            with pytest.raises(QueueClosed, match=r"^the queue is closed; cannot push job 'new'$"):
                await q.apush_and_wait(Job("new", jobs.getpid))

        asyncio.run(main())
        # What the queue knew stays readable.
        assert q.state("done") == Completed(pid)
        assert q.state("new") is None
        q.close()
        q.close(wait=False)
        assert q.closed and q._worker_pids() == []
    finally:
        q.close(wait=False)
    assert read_log(log) == [f"ran {pid}"]


def test_the_context_manager_closes_waiting_for_jobs(log: str) -> None:
    with ProcQueue(lanes=1) as q:
        assert isinstance(q, ProcQueue) and not q.closed
        handles = [q.push(Job(f"k{i}", jobs_core.record, args=(log, f"k{i}"))).handle for i in range(3)]
    assert q.closed and q._worker_pids() == []
    assert all(h.done() for h in handles)
    pids = [h.result(timeout=0) for h in handles]
    assert read_log(log) == [f"k{i} {pid}" for i, pid in enumerate(pids)]
    with pytest.raises(QueueClosed):
        q.push(Job("after", jobs.getpid))


def test_the_context_manager_closes_waiting_when_its_body_raises(log: str) -> None:
    with pytest.raises(RuntimeError, match="^inside the block$"):
        with ProcQueue(lanes=1) as q:
            handle = q.push(Job("k", jobs_core.record, args=(log,))).handle
            raise RuntimeError("inside the block")
    assert q.closed and q._worker_pids() == []
    assert handle.done()
    assert read_log(log) == [f"ran {handle.result(timeout=0)}"]


def test_the_context_manager_on_keyboard_interrupt_closes_without_waiting(gates: Gates, log: str) -> None:
    gate = gates("held")
    with pytest.raises(KeyboardInterrupt):
        with ProcQueue(lanes=1) as q:
            held = q.push(Job("held", jobs_core.record_signal_wait, args=(log, gate.started, gate.go))).handle
            gate.wait_started()
            raise KeyboardInterrupt
    assert q.closed and q._worker_pids() == []
    with pytest.raises(JobFailed, match="^job 'held' failed: cancelled: ") as info:
        held.result(timeout=WAIT)
    assert info.value.failure.kind == "cancelled"


def test_close_waiting_lets_running_and_waiting_jobs_complete(gates: Gates, log: str) -> None:
    with open_queue({"one": 1}) as q:
        gate = gates("running")
        running = q.push(Job("running", jobs_core.record_signal_wait, args=(log, gate.started, gate.go, "running")))
        pid = gate.wait_started()
        waiting = q.push(Job("waiting", jobs_core.record, args=(log, "waiting")))
        assert q.state("waiting") == Pending()

        closing = BlockingCall(lambda: q.close(wait=True))
        closing.wait_blocked()  # close() is waiting for the jobs
        with pytest.raises(QueueClosed, match=r"^the queue is closed; cannot push job 'late'$"):
            q.push(Job("late", jobs.getpid))
        assert q.state("running") == Processing() and q.state("waiting") == Pending()
        assert not running.handle.done()

        gate.open()
        assert closing.outcome() is None
        assert q._worker_pids() == []
        assert running.handle.result(timeout=0) == pid
        assert waiting.handle.result(timeout=0) == pid
        assert q.state("running") == Completed(pid) and q.state("waiting") == Completed(pid)
        assert read_log(log) == [f"running {pid}", f"waiting {pid}"]


def test_close_waiting_lets_a_push_blocked_for_room_in_and_runs_it(gates: Gates, log: str) -> None:
    # The blocked push claimed its key before close(): it is not a new push,
    # so close(wait=True) waits for it like any other waiting job.
    with open_queue({"one": Lane(workers=1, capacity=1)}) as q:
        gate = gates("running")
        running = q.push(Job("running", jobs_core.record_signal_wait, args=(log, gate.started, gate.go, "running")))
        pid = gate.wait_started()
        waiting = q.push(Job("waiting", jobs_core.record, args=(log, "waiting")))
        blocked = BlockingCall(lambda: q.push(Job("blocked", jobs_core.record, args=(log, "blocked"))))
        blocked.wait_blocked()
        closing = BlockingCall(lambda: q.close(wait=True))
        closing.wait_blocked()
        gate.open()
        outcome = blocked.outcome()
        assert type(outcome) is Queued
        assert closing.outcome() is None
        assert q._worker_pids() == []
        assert [h.result(timeout=0) for h in (running.handle, waiting.handle, outcome.handle)] == [pid] * 3
        assert read_log(log) == [f"running {pid}", f"waiting {pid}", f"blocked {pid}"]


def test_close_without_waiting_cancels_waiting_and_running_jobs(gates: Gates, log: str) -> None:
    with open_queue({"one": Lane(workers=1, capacity=1)}, on_mismatch="ignore") as q:
        gate = gates("running")
        running = q.push(Job("running", jobs_core.record_signal_wait, args=(log, gate.started, gate.go, "running")))
        pid = gate.wait_started()
        waiting = q.push(Job("waiting", jobs_core.record, args=(log, "waiting")))
        joined = q.push(Job("waiting", jobs_core.record, args=(log, "joined")))
        assert type(joined) is InFlight
        blocked = BlockingCall(lambda: q.push(Job("blocked", jobs_core.record, args=(log, "blocked"))))
        blocked.wait_blocked()
        assert q.state("blocked") == Pending()
        worker = psutil.Process(pid)

        q.close(wait=False)

        assert q._worker_pids() == []
        assert not worker.is_running()  # killed and reaped
        for name, outcome in (("running", running), ("waiting", waiting), ("waiting", joined)):
            with pytest.raises(
                JobFailed,
                match=rf"^job '{name}' failed: cancelled: job '{name}' was cancelled: the queue was closed without waiting$",
            ) as info:
                outcome.handle.result(timeout=WAIT)
            assert info.value.failure.kind == "cancelled"
            state = q.state(name)
            assert isinstance(state, Failed) and state.failure.kind == "cancelled"
        assert running.handle.state.failure.pid == pid  # type: ignore[union-attr]
        # The push still waiting for room never got in: QueueClosed, the key as it was.
        with pytest.raises(QueueClosed, match=r"^the queue was closed while job 'blocked' waited for room$"):
            blocked.outcome()
        assert q.state("blocked") is None
        assert read_log(log) == [f"running {pid}"]  # neither of the others ever ran
        with pytest.raises(QueueClosed):
            q.push(Job("running", jobs.getpid))


def test_close_without_waiting_cancels_a_push_that_claimed_its_key_just_before(gates: Gates, log: str) -> None:
    """A push claims its key, then close(wait=False) runs (from another thread)
    before the push reaches its lane: that job is waiting, so it is cancelled
    too (or the push raises QueueClosed); it never runs, and close(wait=False)
    does not wait for it."""
    with open_queue({"one": 1}) as q:
        running_gate, late_gate = gates("running"), gates("late")
        running = q.push(Job("running", jobs_core.record_signal_wait, args=(log, running_gate.started, running_gate.go, "running")))
        running_gate.wait_started()
        waiting = q.push(Job("waiting", jobs_core.record, args=(log, "waiting")))
        closing: dict[str, BlockingCall] = {}

        def close_meanwhile() -> None:  # runs inside the push of "late", after its claim
            closing["call"] = BlockingCall(lambda: q.close(wait=False))
            # Once "waiting" is cancelled, close(wait=False) has cancelled what it saw.
            with pytest.raises(JobFailed, match="cancelled"):
                waiting.handle.result(timeout=WAIT)

        late = Job("late", jobs_core.record_and_wait, args=(log, late_gate.go, OnPickle(close_meanwhile, "late")))
        try:
            try:
                outcome: Any = q.push(late)
            except QueueClosed:
                outcome = None
            closing["call"].outcome(timeout=10)  # close(wait=False) returns: it never waits for a job
            if outcome is not None:
                with pytest.raises(JobFailed, match="cancelled"):
                    outcome.handle.result(timeout=WAIT)
            assert not any(line.startswith("late ") for line in read_log(log))
            with pytest.raises(JobFailed, match="cancelled"):
                running.handle.result(timeout=WAIT)
        finally:
            late_gate.open()  # if "late" did start, let it end so nothing hangs
            if "call" in closing:
                closing["call"].outcome(timeout=WAIT)


# --- Failure and JobFailed ---------------------------------------------------------------------


def test_failure_str_reads_well() -> None:
    assert str(Failure("error", "ValueError: bad input", exc_type="ValueError")) == "error: ValueError: bad input"
    assert str(Failure("error", "bad input", exc_type="ValueError")) == "error: ValueError: bad input"
    assert str(Failure("cancelled", "job 'k' was cancelled")) == "cancelled: job 'k' was cancelled"
    crashed = Failure("crashed", "worker process 7 was killed by SIGSEGV (signal 11)", exitcode=-11, signal="SIGSEGV")
    assert str(crashed) == "crashed: worker process 7 was killed by SIGSEGV (signal 11)"
    assert "exception" not in repr(Failure("error", "x", exception=ValueError("x")))


def test_job_failed_carries_the_exception_and_the_childs_traceback(start_method: str) -> None:
    with open_queue({"main": 1}, start_method=start_method) as q:
        with pytest.raises(JobFailed, match=r"^job 'bad' failed: error: ValueError: bad input$") as info:
            q.push_and_wait(Job("bad", jobs.boom, args=("bad input",)), timeout=WAIT)
    error = info.value
    assert error.key == "bad"
    failure = error.failure
    assert (failure.kind, failure.exc_type, failure.message) == ("error", "ValueError", "ValueError: bad input")
    assert str(failure) == "error: ValueError: bad input"
    assert failure.pid is not None and failure.pid != os.getpid()
    cause = error.__cause__
    assert type(cause) is ValueError and cause.args == ("bad input",)
    assert failure.exception is cause
    remote = cause.__cause__
    assert remote is not None
    text = str(remote)
    assert text == failure.traceback
    assert text.startswith("Traceback (most recent call last):")
    assert 'jobs.py", line' in text and "in boom" in text and "raise ValueError(message)" in text
    assert text.rstrip().endswith("ValueError: bad input")
    # JobFailed pickles (e.g. to be sent on from a process pool).
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.key, copy.failure) == ("bad", failure)


# --- push_and_wait -------------------------------------------------------------------------------


@pytest.mark.key_decides  # pushes other work under a held key on purpose: on_mismatch="ignore"
def test_push_and_wait_returns_cached_output_and_raises_job_failed(queue: ProcQueue, log: str) -> None:
    pid = queue.push_and_wait(Job("p", jobs_core.record, args=(log,)), timeout=WAIT)
    assert queue.push(Job("p", jobs_core.record, args=(log,))) == Cached(pid)
    assert queue.push_and_wait(Job("p", jobs_core.record, args=(log, "again")), timeout=WAIT) == pid
    assert queue.push_and_wait(Job("p", jobs_core.record, args=(log, "again"))) == pid
    assert read_log(log) == [f"ran {pid}"]
    with pytest.raises(JobFailed, match=r"^job 'e' failed: error: ValueError: nope$"):
        queue.push_and_wait(Job("e", jobs.boom, args=("nope",)), timeout=WAIT)
    assert isinstance(queue.state("e"), Failed)

    async def main() -> None:
        assert await queue.apush_and_wait(Job("p", jobs.boom), timeout=WAIT) == pid
        with pytest.raises(JobFailed, match=r"^job 'e2' failed: error: ValueError: async nope$"):
            await queue.apush_and_wait(Job("e2", jobs.boom, args=("async nope",)))

    asyncio.run(main())
    assert read_log(log) == [f"ran {pid}"]


@pytest.mark.key_decides  # pushes other work under a held key on purpose: on_mismatch="ignore"
def test_push_and_wait_joins_a_running_job(queue: ProcQueue, gates: Gates, log: str) -> None:
    gate = gates("held")
    first = queue.push(Job("held", jobs_core.record_signal_wait, args=(log, gate.started, gate.go)))
    pid = gate.wait_started()
    joiner = BlockingCall(lambda: queue.push_and_wait(Job("held", jobs_core.record, args=(log,)), timeout=WAIT))
    joiner.wait_blocked()  # waiting on the running job
    gate.open()
    assert joiner.outcome() == pid == first.handle.result(timeout=WAIT)
    assert read_log(log) == [f"ran {pid}"]


def test_push_and_wait_past_its_timeout_leaves_the_job_running(queue: ProcQueue, gates: Gates, log: str) -> None:
    gate = gates("slow")
    job = Job("slow", jobs_core.record_signal_wait, args=(log, gate.started, gate.go))
    first = queue.push(job)
    pid = gate.wait_started()
    with pytest.raises(TimeoutError, match=r"^job 'slow' has not finished after "):
        queue.push_and_wait(job, timeout=0.2)
    assert queue.state("slow") == Processing()

    async def main() -> None:
        with pytest.raises(TimeoutError, match=r"^job 'slow' has not finished after 0\.2s; it keeps running$"):
            await queue.apush_and_wait(job, timeout=0.2)

    asyncio.run(main())
    assert queue.state("slow") == Processing()
    gate.open()
    assert queue.push_and_wait(job, timeout=WAIT) == pid
    assert first.handle.result(timeout=0) == pid
    assert read_log(log) == [f"ran {pid}"]


def test_push_and_wait_timeout_message_names_the_callers_timeout(queue: ProcQueue, gates: Gates, log: str) -> None:
    # push_and_wait(timeout=0.2) should say "after 0.2s", as apush_and_wait does,
    # not the remainder of the timeout left once the push returned.
    gate = gates("slow")
    job = Job("slow", jobs_core.record_signal_wait, args=(log, gate.started, gate.go))
    queue.push(job)
    gate.wait_started()
    with pytest.raises(TimeoutError, match=r"^job 'slow' has not finished after 0\.2s; it keeps running$"):
        queue.push_and_wait(job, timeout=0.2)
    gate.open()
    assert queue.push_and_wait(job, timeout=WAIT) == int(read_log(log)[0].split()[1])


def test_an_unpicklable_argument_is_both_a_type_error_and_a_pickling_error(queue: ProcQueue) -> None:
    job = Job("lock", jobs.identity, args=(threading.Lock(),))
    with pytest.raises(procq.JobPicklingError, match=r"^job 'lock': its arguments could not be pickled: ") as info:
        queue.push(job)
    assert isinstance(info.value, TypeError) and isinstance(info.value, pickle.PicklingError)
    assert queue.state("lock") is None


def test_a_module_level_function_is_pickled_once_per_queue(queue: ProcQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    real = procq._push.dumps_fn
    pickled: list[object] = []

    def counting(fn: object) -> bytes:
        pickled.append(fn)
        return real(fn)

    monkeypatch.setattr(procq._push, "dumps_fn", counting)
    outputs = [queue.push_and_wait(Job(f"sq:{i}", jobs.square, args=(i,)), timeout=20) for i in range(6)]
    assert outputs == [i * i for i in range(6)]
    assert pickled == [jobs.square]

    # A closure is pickled at every push: it runs with what it captures now.
    base = 10
    add = lambda x: x + base  # noqa: E731
    first = queue.push_and_wait(Job("add:1", add, args=(1,)), timeout=20)
    base = 20
    second = queue.push_and_wait(Job("add:2", add, args=(1,)), timeout=20)
    assert (first, second) == (11, 21)
    assert pickled == [jobs.square, add, add]
