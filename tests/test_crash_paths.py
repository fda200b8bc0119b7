"""Failures on the way to and from a worker land on that job's future or
handle, never elsewhere: pickling that raises ``SystemExit``, done callbacks
that raise anything but ``KeyboardInterrupt``. (As loky's crash tests ask of
an executor.)"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import gc
import logging
import pickle
import threading
import weakref
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import executor_jobs as ej
import psutil
import pytest

from procq import Executor, Job, JobFailed, JobPicklingError, Lane, ProcQueue

WAIT = 30


class CallableExitAtPickle:
    """A job's function whose pickling exits the process that pickles it."""

    def __call__(self) -> None:
        return None

    def __reduce__(self) -> tuple[object, ...]:
        ej.exit_1()
        raise AssertionError("unreachable")


@pytest.mark.parametrize("where", ["argument", "function"])
def test_pickling_that_exits_fails_the_future_not_submit(where: str) -> None:
    with Executor(1) as ex:
        calls = {"argument": (ej.mul, ej.ExitAtPickle(), 2), "function": (CallableExitAtPickle(),)}
        future = ex.submit(*calls[where])
        error = future.exception(timeout=WAIT)
        assert isinstance(error, JobPicklingError) and isinstance(error, pickle.PicklingError), error
        assert "SystemExit" in str(error)
        assert isinstance(error.__cause__, SystemExit)
        assert ex.submit(ej.mul, 2, 3).result(timeout=WAIT) == 6


def test_a_push_whose_pickling_exits_raises_a_pickling_error_and_leaves_the_key_free() -> None:
    with ProcQueue(1) as q:
        with pytest.raises(JobPicklingError, match="SystemExit") as caught:
            q.push(Job("k", ej.mul, args=(ej.ExitAtPickle(), 2)))
        assert isinstance(caught.value.__cause__, SystemExit)
        assert q.push_and_wait(Job("k", ej.mul, args=(3, 2)), timeout=WAIT) == 6


@pytest.mark.parametrize("raised", [SystemExit, ValueError])
def test_a_callback_that_raises_is_logged_and_reaches_no_waiter(
    raised: type[BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    called = threading.Event()

    def callback(_: object) -> None:
        called.set()
        raise raised("from the callback")

    with Executor(1) as ex, caplog.at_level(logging.ERROR, logger="procq"):
        future = ex.submit(ej.mul, 2, 2)
        future.add_done_callback(callback)
        assert future.result(timeout=WAIT) == 4  # a waiter on this thread, which may run the callback
        assert called.wait(WAIT)
        late = ex.submit(ej.mul, 3, 3)
        cf.wait([late], timeout=WAIT)
        late.add_done_callback(callback)  # (done already: called at once, in this thread)
        assert ex.submit(ej.mul, 5, 5).result(timeout=WAIT) == 25  # the queue serves on
    assert len([r for r in caplog.records if "exception calling callback" in r.getMessage()]) == 2


def test_a_handles_callback_that_exits_leaves_the_queue_serving(caplog: pytest.LogCaptureFixture) -> None:
    def callback(_: object) -> None:
        raise SystemExit(3)

    with ProcQueue(1) as q, caplog.at_level(logging.ERROR, logger="procq"):
        handles = [q.push(Job(f"k{i}", ej.mul, args=(i, 2))).handle for i in range(4)]
        for handle in handles:
            handle.add_done_callback(callback)
        assert [h.result(timeout=WAIT) for h in handles] == [0, 2, 4, 6]
        assert q.push_and_wait(Job("after", ej.mul, args=(7, 7)), timeout=WAIT) == 49
    assert len([r for r in caplog.records if "exception calling callback" in r.getMessage()]) == 4


CAUSED = [
    pytest.param(ej.mul, (ej.ExitAtUnpickle(), 2), "SystemExit", id="arguments: exit at unpickling"),
    pytest.param(ej.mul, (ej.ErrorAtUnpickle(), 2), "UnpicklingError", id="arguments: error at unpickling"),
    pytest.param(ej.return_instance, (ej.ExitAtUnpickle,), "SystemExit", id="result: exit at unpickling"),
    pytest.param(ej.return_instance, (ej.ErrorAtUnpickle,), "UnpicklingError", id="result: error at unpickling"),
]


@pytest.mark.parametrize(("fn", "args", "match"), CAUSED)
def test_a_job_broken_on_its_way_has_the_original_error_as_its_cause(
    fn: object, args: tuple[object, ...], match: str
) -> None:
    """The future fails with ``BrokenProcessPool``; its ``__cause__`` carries
    the error where it was raised (its type, message and traceback) as text."""
    with Executor(1) as ex:
        error = ex.submit(fn, *args).exception(timeout=WAIT)  # type: ignore[arg-type]
        assert isinstance(error, BrokenProcessPool), error
        cause = error.__cause__
        assert isinstance(cause, Exception) and match in str(cause), repr(cause)
        assert str(cause).startswith("Traceback (most recent call last):")
        assert ex.submit(ej.mul, 2, 3).result(timeout=WAIT) == 6


def test_informative_error_when_arguments_fail_to_unpickle() -> None:
    with Executor(2) as ex:
        future = ex.submit(id, ej.ErrorWithMessageAtUnpickle(RuntimeError, "message raised in child"))
        with pytest.raises(BrokenProcessPool) as caught:
            future.result(timeout=WAIT)
    assert "RuntimeError" in str(caught.value.__cause__)
    assert "message raised in child" in str(caught.value.__cause__)


@pytest.mark.parametrize("trusted", [True, False], ids=["trusted", "untrusted"])
def test_a_handles_job_failed_carries_the_workers_traceback_as_its_cause(trusted: bool) -> None:
    with ProcQueue({"default": Lane(workers=1, trusted=trusted)}) as q:
        with pytest.raises(JobFailed) as caught:
            q.push_and_wait(
                Job("args", ej.mul, args=(ej.ErrorWithMessageAtUnpickle(KeyError, "in the worker"), 2)), timeout=WAIT
            )
        assert caught.value.failure.kind == "error"
        assert "KeyError" in str(caught.value.__cause__) and "in the worker" in str(caught.value.__cause__)
        with pytest.raises(JobFailed) as raised:
            q.push_and_wait(Job("raise", ej.raise_error_with, args=(ValueError, "its own")), timeout=WAIT)
        cause = raised.value.__cause__
        if trusted:  # the exception itself, with the worker's traceback as its own cause
            assert isinstance(cause, ValueError) and "its own" in str(cause.__cause__)
        else:  # (an untrusted lane sends no exception object: its text)
            assert "ValueError: its own" in str(cause)


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    """The cyclic garbage collector off: what is dropped goes by its reference count alone."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _all_exit(pids: list[int]) -> None:
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=WAIT)
    assert not alive, f"workers still running after their executor was dropped: {alive}"


def test_an_executor_dropped_without_shutdown_stops_its_workers(no_cycle_collector: None) -> None:
    ex = Executor(2)
    assert ex.submit(ej.mul, 2, 3).result(timeout=WAIT) == 6
    pids = ex.queue._worker_pids()
    assert len(pids) == 2
    dropped = weakref.ref(ex)
    del ex
    assert dropped() is None  # no reference cycle holds it
    _all_exit(pids)


def test_an_executor_shut_down_and_dropped_leaves_no_cycle(no_cycle_collector: None) -> None:
    """Nothing it made waits for the cyclic collector (whose finalizers may
    run at any allocation, inside multiprocessing's own locks among others)."""
    ex = Executor(2)
    futures = [ex.submit(ej.mul, i, 2) for i in range(8)]  # (more than its window: some wait in the feed)
    assert [f.result(timeout=WAIT) for f in futures] == [2 * i for i in range(8)]
    ex.shutdown()
    dropped, queue = weakref.ref(ex), weakref.ref(ex.queue)
    del ex, futures
    assert dropped() is None and queue() is None


def test_an_executor_dropped_with_calls_running_and_waiting_finishes_them(
    no_cycle_collector: None, tmp_path: Path
) -> None:
    """As ``ProcessPoolExecutor``: its submitted calls run to their end, then its workers stop."""
    go = str(tmp_path / "go")
    ex = Executor(1)
    blocked = ex.submit(ej.wait_for_file, go)
    queued = [ex.submit(ej.mul, i, 2) for i in range(4)]  # (past the lane's window: some wait in the executor)
    pids = ex.queue._worker_pids()
    dropped = weakref.ref(ex)
    del ex
    Path(go).touch()
    assert blocked.result(timeout=WAIT) is None
    assert [f.result(timeout=WAIT) for f in queued] == [0, 2, 4, 6]
    _all_exit(pids)
    assert dropped() is None


def test_a_queue_dropped_without_close_stops_its_workers(no_cycle_collector: None) -> None:
    q = ProcQueue(2)
    assert q.push_and_wait(Job("k", ej.mul, args=(2, 3)), timeout=WAIT) == 6
    pids = q._worker_pids()
    dropped = weakref.ref(q)
    del q
    assert dropped() is None
    _all_exit(pids)
