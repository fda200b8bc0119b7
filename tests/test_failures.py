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


@pytest.mark.parametrize("trusted", [True, False])
def test_a_failed_jobs_traceback_starts_with_the_jobs_own_frames(trusted: bool) -> None:
    """The worker's frames that called the job (its loop, its report) are not
    the job's: the stored traceback starts at the job's function."""
    from procq import Lane

    with open_queue({"main": Lane(workers=1, trusted=trusted)}) as q, pytest.raises(JobFailed) as info:
        q.push_and_wait(Job("bad", jobs.boom, args=("bad input",)), timeout=WAIT)
    text = info.value.failure.traceback
    assert text is not None
    frames = [line for line in text.splitlines() if line.lstrip().startswith('File "')]
    assert frames and "jobs.py" in frames[0] and "boom" in frames[0], text
    assert not any(f"{os.sep}procq{os.sep}" in line for line in frames), text


def test_public_errors_print_and_pickle_by_their_public_name() -> None:
    """What a program catches it reads as procq.<Name> (a traceback's last
    line, a log), and a pickle names it so: never a private module's path."""
    import traceback

    import procq

    made = [
        JobFailed("k", Failure("error", "x")), procq.QueueClosed("closed"), procq.LaneFull("full"),
        procq.StoreUnavailable("gone"), procq.InitializerFailed("init"), procq.JobPicklingError("p"),
        procq.KeyConflict("key k: another function", "k", "function"), procq.SandboxUnavailable("no", "network"),
        procq.WrongProcess(1, 2),
    ]  # fmt: skip
    for error in made:
        name = type(error).__name__
        assert getattr(procq, name) is type(error)
        assert "".join(traceback.format_exception_only(type(error), error)).startswith(f"procq.{name}: "), name
        assert b"procq._" not in pickle.dumps(type(error)), name  # the class, by its public name
        assert type(pickle.loads(pickle.dumps(error))) is type(error)
