"""What the supervisor's I/O thread leaves to a lane's decode thread: a
trusted result or exception whose unpickling may run the job's own code (or
that is large), and an untrusted answer that is large. Whatever the decoding
does, it fails only its own job, and the key is Processing until it ends."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import jobs
import jobs_decoding as jd
import jobs_hardening as hj
import pytest
from core_support import failure_of, open_queue
from hypothesis import given
from hypothesis import strategies as st

from procq import Completed, Failed, Job, JobFailed, Lane, Processing, Retry
from procq._wire.plain import names_nothing, result_frame
from procq._wire.protocol import OK, TRAILER


def test_user_code_in_a_result_runs_on_its_lanes_decode_thread() -> None:
    jd.DECODED_ON.clear()
    with open_queue({"objects": 1}) as q:
        assert q.push_and_wait(Job("recorded", jd.result_recording, args=(5,))) == 5
        # Plain data is decoded on the I/O thread: nothing is recorded for it.
        assert q.push_and_wait(Job("plain", jobs.identity, args=({"a": [1, 2.5, "cé", b"x", None]},))) == {
            "a": [1, 2.5, "cé", b"x", None]
        }
    assert len(jd.DECODED_ON) == 1 and jd.DECODED_ON[0].startswith("procq-decode-"), jd.DECODED_ON


@pytest.mark.parametrize(
    ("fn", "args", "expected"),
    [
        (jd.a_datetime, (3,), jd.a_datetime(3)),  # names a class: decoded on the decode thread
        (jd.many_ints, (300_000,), list(range(300_000))),  # large: decoded on the decode thread
        (jobs.identity, ("c" * 10,), "c" * 10),  # opcode bytes inside a string: the data-only unpickler
        (jobs.identity, (frozenset({1, 2}),), frozenset({1, 2})),
    ],
    ids=["class", "large", "opcode-bytes-in-data", "frozenset"],
)
def test_results_of_every_kind_come_back_whole(fn: Any, args: tuple[Any, ...], expected: Any) -> None:
    with open_queue(1) as q:
        assert q.push_and_wait(Job("result", fn, args=args), timeout=60) == expected


def test_reports_decoded_here_and_there_settle_in_a_pipelined_lane() -> None:
    """Short jobs sent ahead to one worker, results of every kind mixed: each
    job gets its own result, whichever thread decoded it."""
    with open_queue({"one": Lane(workers=1)}) as q:
        makers = [(jobs.square, lambda i: i * i), (jd.a_datetime, lambda i: jd.a_datetime(i % 28 + 1))]
        handles = []
        for i in range(200):
            fn, _ = makers[i % 2]
            arg = i if fn is jobs.square else i % 28 + 1
            handles.append(q.push(Job(f"mixed:{i}", fn, args=(arg,))).handle)
        for i, handle in enumerate(handles):
            assert handle.result(timeout=60) == makers[i % 2][1](i)
        q._check_invariants()


def test_a_job_exception_of_its_own_class_is_the_cause() -> None:
    with open_queue(1) as q, pytest.raises(JobFailed) as info:
        q.push_and_wait(Job("raises", jd.raise_plain, args=("mine",)))
    assert type(info.value.__cause__) is jd.PlainError
    assert info.value.failure.kind == "error"


def test_an_exception_that_cannot_be_unpickled_in_the_supervisor_fails_its_job_as_error() -> None:
    with open_queue(1) as q:
        failure = failure_of(q.push(Job("refused", jd.raise_refused, args=("nope",))).handle, "error")
        assert failure.exc_type == "RefusedInSupervisor" and failure.exception is None
        assert "could not be unpickled" in failure.message and "SystemExit" in failure.message
        assert "nope" in failure.message
        assert q.push_and_wait(Job("next", jobs.square, args=(3,))) == 9
        lane = q.stats().lanes["default"]
        assert lane.worker_restarts == 0 and lane.crashes == 0


def test_a_retry_whose_exceptions_are_decoded_later_runs_every_attempt() -> None:
    retry = Retry(attempts=3, backoff=0.01, jitter=0.0, on=("error",))
    with open_queue(1) as q:
        failure = failure_of(q.push(Job("flaky", jd.raise_plain, args=("again",), retry=retry)).handle, "error")
        assert failure.attempts == 3
        q._check_invariants()


def test_cancelling_a_job_whose_result_is_being_decoded(tmp_path: Path) -> None:
    gate = jobs.fifo(tmp_path, "unpickle-gate")
    with open_queue({"one": 1}) as q:
        handle = q.push(Job("slow", hj.result_blocking_on_unpickle, args=(gate, "late"))).handle
        # Its worker has reported it (and is free) once a later job has run.
        assert q.push_and_wait(Job("after", jobs.square, args=(2,)), timeout=20) == 4
        assert q.state("slow") == Processing()
        assert q.stats().lanes["one"].running == 1
        q._check_invariants()
        assert q.cancel("slow")
        assert "decoded" in failure_of(handle, "cancelled", timeout=0).message
        fd = jobs.release(gate)
        try:
            # The decode's late outcome is dropped; the key runs again like any failed key.
            assert q.push_and_wait(Job("slow", jobs.identity, args=("again",)), timeout=30) == "again"
        finally:
            os.close(fd)
        assert q.state("slow") == Completed("again")
        assert q.stats().lanes["one"].running == 0
        q._check_invariants()


# --- untrusted lanes ------------------------------------------------------------


@pytest.fixture
def sandbox() -> Any:
    with open_queue({"sandbox": Lane(workers=1, trusted=False)}) as q:
        yield q


@pytest.mark.parametrize(
    ("fn", "args"),
    [(jobs.identity, ("x" * 200_000,)), (jd.many_ints, (60_000,)), (jobs.identity, ({"k": [[1], {"a": None}]},))],
    ids=["large-string", "large-list", "small"],
)
def test_untrusted_answers_large_and_small_come_back(sandbox: Any, fn: Any, args: tuple[Any, ...]) -> None:
    expected = fn(*args)
    assert sandbox.push_and_wait(Job(f"answer:{fn.__name__}", fn, args=args), timeout=60) == expected
    sandbox._check_invariants()


def test_a_large_untrusted_error_comes_back(sandbox: Any) -> None:
    failure = failure_of(sandbox.push(Job("long-error", jd.raise_long, args=(150_000,))).handle, "error")
    assert failure.exc_type == "ValueError" and "x" * 1000 in failure.message
    assert sandbox.push_and_wait(Job("after", jobs.square, args=(6,))) == 36


def test_a_lanes_own_bound_on_values() -> None:
    with open_queue({"tight": Lane(workers=1, trusted=False, max_result_values=10)}) as q:
        assert q.push_and_wait(Job("few", jobs.identity, args=(list(range(5)),))) == list(range(5))
        failure = failure_of(q.push(Job("many", jobs.identity, args=(list(range(20)),))).handle, "protocol")
        assert "max_result_values of 10" in failure.message and "values" in failure.message
        assert isinstance(q.state("many"), Failed)
        assert q.stats().lanes["tight"].worker_restarts == 0  # the job failed; its worker was fine
        assert q.push_and_wait(Job("after", jobs.square, args=(2,))) == 4


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "many", None])
def test_max_result_values_must_be_a_positive_int(bad: Any) -> None:
    with pytest.raises(ValueError, match="lane max_result_values must be an int of at least 1"):
        Lane(trusted=False, max_result_values=bad)


_NAMING = b"\x82\x83\x84\x93"


@given(st.binary(max_size=200), st.integers(min_value=0, max_value=3))
def test_the_opcode_scan_errs_only_on_the_safe_side(data: bytes, newlines: int) -> None:
    """``names_nothing`` (one regular expression for a few bytes, a memchr
    per opcode byte beyond) clears a pickle exactly when no byte of a naming
    opcode is in it, or only text ones with fewer than two newlines."""
    data += b"\n" * newlines
    expected = not any(b in _NAMING for b in data) and (data.count(b"\n") < 2 or not any(b in b"ci" for b in data))
    assert names_nothing(data) is expected
    assert names_nothing(bytearray(data)) is expected


@pytest.mark.parametrize("result", [None, 1, "x" * 100, [1.5, b"\x93"], {"a": (1, 2)}, ValueError("v")])
def test_a_result_needing_no_code_is_marked_plain(result: Any) -> None:
    data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
    frame = result_frame(7, result)
    body = frame if isinstance(frame, bytes) else frame.data + frame.trailer
    job_id, tag = TRAILER.unpack(body[-TRAILER.size :])
    assert body[: -TRAILER.size] == data and job_id == 7
    assert (tag == OK) is (not isinstance(result, BaseException))
