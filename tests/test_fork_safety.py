"""A queue belongs to the process that opened it. A child made with
``os.fork()`` that uses its parent's queue gets a clear error, and the
parent's queue, workers and keys are untouched."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import jobs
import pytest
from core_support import WAIT, open_queue

from procq import Job, ProcQueueError, WrongProcess

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _in_forked_child(action: object) -> str:
    """Run ``action()`` in a forked child; return what it printed about the outcome."""
    r, w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # forking a threaded process
        pid = os.fork()
    if pid == 0:  # the child: report, and exit without running the parent's cleanup
        os.close(r)
        try:
            try:
                result = f"returned {action()!r}"  # type: ignore[operator]
            except ProcQueueError as e:
                result = f"ProcQueueError: {e}"
            except BaseException as e:
                result = f"{type(e).__name__}: {e}"
            os.write(w, result.encode()[:4000])
        finally:
            os._exit(0)
    os.close(w)
    try:
        chunks = []
        while chunk := os.read(r, 4096):
            chunks.append(chunk)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    return b"".join(chunks).decode()


@pytest.mark.parametrize(
    "use",
    [
        "push", "push_and_wait", "push_all", "cancel", "state", "close",
        "push_cached", "apush", "apush_all", "map", "forget", "keys", "handles", "stats", "handle_result",
        "close_wait", "exit_with",
    ],
)  # fmt: skip
def test_a_forked_child_cannot_use_its_parents_queue(use: str) -> None:
    with open_queue({"cpu": 1}) as q:
        assert q.push_and_wait(Job("before", jobs.square, args=(2,))) == 4
        pids = q._worker_pids()
        # A job the parent's worker holds at the fork: the child must not wait for it, nor end it.
        running = q.push(Job("running", jobs.sleep, args=(0.5,))).handle  # type: ignore[union-attr]
        actions = {
            "push": lambda: q.push(Job("child", jobs.square, args=(3,))),
            "push_cached": lambda: q.push(Job("before", jobs.square, args=(2,))),  # the lock-free path
            "push_and_wait": lambda: q.push_and_wait(Job("child", jobs.square, args=(3,))),
            "push_all": lambda: q.push_all([Job("child", jobs.square, args=(3,))]),
            "apush": lambda: asyncio.run(q.apush(Job("child", jobs.square, args=(3,)))),
            "apush_all": lambda: asyncio.run(q.apush_all([Job("child", jobs.square, args=(3,))])),
            "map": lambda: q.map(jobs.square, [3]),
            "cancel": lambda: q.cancel("before"),
            "state": lambda: q.state("before"),
            "forget": lambda: q.forget("before"),
            "keys": lambda: q.keys(),
            "handles": lambda: q.handles(),
            "stats": lambda: q.stats(),
            "handle_result": lambda: running.result(timeout=WAIT),
            "close": lambda: q.close(wait=False),
            "close_wait": lambda: q.close(),
            "exit_with": lambda: q.__exit__(None, None, None) or q.push(Job("child", jobs.square, args=(3,))),
        }
        said = _in_forked_child(actions[use])
        assert said.startswith("ProcQueueError: "), said
        assert str(os.getpid()) in said and "fork" in said, said
        # The parent's queue carries on with the same worker.
        assert running.result(timeout=WAIT) == 0.5
        assert q.push_and_wait(Job("after", jobs.square, args=(5,))) == 25
        assert q._worker_pids() == pids
        assert q.state("child") is None
        assert q.stats().lanes["cpu"].worker_restarts == 0
        q._check_invariants()


def test_the_error_says_what_to_do() -> None:
    with open_queue(1) as q:
        said = _in_forked_child(lambda: q.push(Job("child", jobs.square, args=(3,))))
    assert "open a new ProcQueue" in said, said
    assert sys.platform  # (the message names the owning pid and this one)


def test_the_error_names_both_processes() -> None:
    with open_queue(1) as q:
        said = _in_forked_child(
            lambda: (lambda e: (type(e).__name__, e.owner_pid, e.pid == os.getpid(), q.closed))(
                _raised(lambda: q.push(Job("child", jobs.square, args=(3,))))
            )
        )
        assert said == f"returned ('WrongProcess', {os.getpid()}, True, True)", said
        assert not q.closed
    assert issubclass(WrongProcess, ProcQueueError)


def _raised(action: object) -> BaseException:
    try:
        action()  # type: ignore[operator]
    except BaseException as e:
        return e
    raise AssertionError("did not raise")


def _push_in_child(q: object, out: object) -> None:
    try:
        q.push(Job("child", jobs.square, args=(3,)))  # type: ignore[attr-defined]
        out.put("pushed")  # type: ignore[attr-defined]
    except WrongProcess as e:
        out.put(f"WrongProcess {e.owner_pid}")  # type: ignore[attr-defined]


def test_a_multiprocessing_fork_child_cannot_use_it_either() -> None:
    context = multiprocessing.get_context("fork")
    with open_queue({"cpu": 1}) as q:
        pids = q._worker_pids()
        out = context.SimpleQueue()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # forking a threaded process
            child = context.Process(target=_push_in_child, args=(q, out))
            child.start()
        child.join(WAIT)
        assert child.exitcode == 0
        assert out.get() == f"WrongProcess {os.getpid()}"
        assert q.push_and_wait(Job("after", jobs.square, args=(5,))) == 25
        assert q._worker_pids() == pids


@pytest.mark.parametrize("mode", ["exit", "gc", "with"])
def test_a_forked_child_that_ends_leaves_its_parents_queue_alone(mode: str) -> None:
    """Its exit, its garbage collection and its unwinding run none of the
    parent's closing: no hang waiting for the parent's jobs, no worker ended."""
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(here / "fork_probe.py"), mode], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


def test_the_child_can_open_a_queue_of_its_own() -> None:
    """What the error advises works: a queue the child opens starts workers
    (and a forkserver) of its own, and the parent's carries on."""

    def own_queue() -> object:
        from procq import ProcQueue

        with ProcQueue(1) as mine:
            return mine.push_and_wait(Job("child", jobs.square, args=(4,)), timeout=WAIT)

    with open_queue(1) as q:
        assert q.push_and_wait(Job("before", jobs.square, args=(2,))) == 4
        pids = q._worker_pids()
        assert _in_forked_child(own_queue) == "returned 16"
        assert q.push_and_wait(Job("after", jobs.square, args=(5,))) == 25
        assert q._worker_pids() == pids and q.state("child") is None


def test_a_child_forked_while_the_resource_tracker_was_busy_can_use_it() -> None:
    """A thread of the parent inside multiprocessing's resource tracker at
    the fork (a queue's starter thread asks it at every worker start) leaves
    the child's copy of its lock held: the child's first tracker call would
    fail as reentrant, or hang. procq's at-fork hook gives the child a fresh one."""
    from multiprocessing import resource_tracker

    tracker: Any = resource_tracker._resource_tracker
    tracker.ensure_running()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with tracker._lock:
            held.set()
            release.wait(WAIT)

    def use_tracker() -> str:
        outcome: list[str] = []

        def call() -> None:
            try:
                tracker.ensure_running()
                outcome.append("ok")
            except BaseException as e:
                outcome.append(type(e).__name__)

        thread = threading.Thread(target=call)
        thread.start()
        thread.join(10)
        return outcome[0] if outcome else "hung"

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(WAIT)
        said = _in_forked_child(use_tracker)
    finally:
        release.set()
        holder.join(WAIT)
    assert said == "returned 'ok'", said
