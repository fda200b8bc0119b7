"""A queue belongs to the process that opened it. A child made with
``os.fork()`` that uses its parent's queue gets a clear error, and the
parent's queue, workers and keys are untouched."""

from __future__ import annotations

import os
import sys
import warnings

import jobs
import pytest
from core_support import open_queue

from procq import Job, ProcQueueError

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
    ["push", "push_and_wait", "push_all", "cancel", "state", "close"],
)
def test_a_forked_child_cannot_use_its_parents_queue(use: str) -> None:
    with open_queue({"cpu": 1}) as q:
        assert q.push_and_wait(Job("before", jobs.square, args=(2,))) == 4
        pids = q._worker_pids()
        actions = {
            "push": lambda: q.push(Job("child", jobs.square, args=(3,))),
            "push_and_wait": lambda: q.push_and_wait(Job("child", jobs.square, args=(3,))),
            "push_all": lambda: q.push_all([Job("child", jobs.square, args=(3,))]),
            "cancel": lambda: q.cancel("before"),
            "state": lambda: q.state("before"),
            "close": lambda: q.close(wait=False),
        }
        said = _in_forked_child(actions[use])
        assert said.startswith("ProcQueueError: "), said
        assert str(os.getpid()) in said and "fork" in said, said
        # The parent's queue carries on with the same worker.
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
