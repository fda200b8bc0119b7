"""What a failed job tells its caller: Failure's text, and JobFailed carrying the exception and the
child's traceback."""

from __future__ import annotations

import os
import pickle

import jobs
import pytest
from core_support import WAIT, open_queue

from procq import Failure, Job, JobFailed


def test_failure_str_reads_well() -> None:
    assert str(Failure("error", "ValueError: bad input", exc_type="ValueError")) == "error: ValueError: bad input"
    assert str(Failure("error", "bad input", exc_type="ValueError")) == "error: ValueError: bad input"
    assert str(Failure("cancelled", "job 'k' was cancelled")) == "cancelled: job 'k' was cancelled"
    crashed = Failure("crashed", "worker process 7 was killed by SIGSEGV (signal 11)", exitcode=-11, signal="SIGSEGV")
    assert str(crashed) == "crashed: worker process 7 was killed by SIGSEGV (signal 11)"
    assert "exception" not in repr(Failure("error", "x", exception=ValueError("x")))


def test_job_failed_carries_the_exception_and_the_childs_traceback(start_method: str) -> None:
    with (
        open_queue({"main": 1}, start_method=start_method) as q,
        pytest.raises(JobFailed, match=r"^job 'bad' failed: error: ValueError: bad input$") as info,
    ):
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
