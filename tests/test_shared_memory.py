"""Large arguments and results of trusted lanes travel out of band, through
shared-memory segments (``procq._wire.oob``, ``procq._wire.shm``): every kind of buffer comes back
equal and of its type, large arrays arrive as views of a mapping (no copy),
small ones stay in the pipe; segments are kept for reuse (an argument's by
the queue, a result's by its worker) and gone when the queue closes."""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

import jobs
import jobs_arrays
import numpy as np
import pytest
from core_support import WAIT, Gates, open_queue

from procq import Job, JobFailed, Lane, Sandbox
from procq._wire.oob import OOB_BYTES
from procq._wire.shm import SHM_DIR, segment_prefix
from procq._wire.shm_results import KEEP_RESULT_SEGMENTS

BIG = OOB_BYTES // 8 * 4  # float64 values: four times the threshold


def segments() -> list[str]:
    """This process's segments (its queues' and their workers')."""
    return sorted(name for name in os.listdir(SHM_DIR) if name.startswith(segment_prefix()))


def no_trim(q: Any, lane: str | None = None) -> None:
    """Keep the queue's worker (of ``lane``) from letting go of its kept
    result segments when idle: a slow step of a test is no idle time."""
    q.push_and_wait(Job("no trim", jobs_arrays.trim_after, args=(60_000,), lane=lane), timeout=WAIT)


def result_segments() -> list[str]:
    """This process's workers' segments (results)."""
    return [name for name in segments() if name.startswith(f"{segment_prefix()}w")]


def same(a: Any, b: Any) -> None:
    """Equal values of the same types, all the way down."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    elif isinstance(a, memoryview):
        assert (a.format, a.shape, a.tobytes()) == (b.format, b.shape, b.tobytes())
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    else:
        assert a == b


_rng = np.random.default_rng(38)
VALUES = {
    "float64": _rng.standard_normal(BIG),
    "int8": _rng.integers(-128, 127, size=BIG * 8, dtype=np.int8),
    "complex128": _rng.standard_normal(BIG // 2) + 1j,
    "bool": _rng.integers(0, 2, size=BIG * 8).astype(bool),
    "datetime64": np.arange(BIG).astype("datetime64[s]"),
    "structured": np.zeros(BIG // 2, dtype=[("a", "<i4"), ("b", "<f8"), ("c", "S4")]),
    "3-d": _rng.standard_normal((64, 64, BIG // 4096)),
    "fortran": np.asfortranarray(_rng.standard_normal((512, BIG // 512))),
    "non-contiguous": _rng.standard_normal((BIG // 256, 512))[::2, ::3],
    "zero-size": np.zeros((0, 5)),
    "zero-size beside a large one": [np.zeros(0), np.ones(BIG), np.zeros((3, 0), dtype=np.int16)],
    "bytes": os.urandom(OOB_BYTES * 2),
    "bytearray": bytearray(os.urandom(OOB_BYTES * 2)),
    "memoryview": memoryview(os.urandom(OOB_BYTES * 2)),
    "memoryview of doubles": memoryview(np.arange(BIG, dtype=np.float64)).cast("B").cast("d", [BIG // 4, 4]),
    "small memoryview": memoryview(b"abc"),
    "nested": {"x": [(_rng.standard_normal(BIG), b"k" * OOB_BYTES)], "y": {"z": np.arange(10)}, "n": None},
}


@pytest.mark.parametrize("value", VALUES.values(), ids=VALUES.keys())
def test_values_go_out_and_come_back_equal(value: Any) -> None:
    with open_queue(1) as q:
        out = q.push_and_wait(Job("echo", jobs.identity, args=(value,)), timeout=WAIT)
        same(value, out)
        out2 = q.push_and_wait(Job("kw", jobs_arrays.total, kwargs={"array": np.ones(BIG)}), timeout=WAIT)
        assert out2 == BIG
        names = segments()
        results = [name for name in names if name.startswith(f"{segment_prefix()}w")]
        # The result's: kept by the worker to write a later result into.
        assert len(results) <= KEEP_RESULT_SEGMENTS
        # The arguments': kept for reuse, and reused when large enough (the
        # second job's may be larger than the first's).
        assert len(names) - len(results) <= 2
    assert segments() == []
    del out


def test_a_large_argument_arrives_as_a_writable_view_of_a_segment() -> None:
    array = np.arange(BIG, dtype=np.float64)
    with open_queue(1) as q:
        total, mapped, writable = q.push_and_wait(Job("m", jobs_arrays.how_it_came, args=(array,)), timeout=WAIT)
        assert (total, mapped, writable) == (array.sum(), True, True)
        # Copy-on-write: the job's writes are its own, the caller's array is untouched.
        out = q.push_and_wait(Job("w", jobs_arrays.add_one_in_place, args=(array,)), timeout=WAIT)
        assert np.array_equal(out, array + 1) and array[0] == 0
        # The segment written again for the next job (or, if the worker still
        # maps it as it returned it, another): what the last job wrote into its
        # private pages is in neither.
        assert q.push_and_wait(Job("again", jobs_arrays.total, args=(array,)), timeout=WAIT) == array.sum()


def test_a_segment_still_mapped_by_a_job_that_kept_its_argument_is_not_reused() -> None:
    with open_queue(1) as q:
        first, second = np.full(BIG, 1.0), np.full(BIG, 2.0)
        assert q.push_and_wait(Job("keep", jobs_arrays.keep, args=(first,)), timeout=WAIT) == BIG
        assert q.push_and_wait(Job("other", jobs_arrays.total, args=(second,)), timeout=WAIT) == 2 * BIG
        assert len(segments()) == 2  # the kept one is passed over: a second one is made
        assert q.push_and_wait(Job("kept", jobs_arrays.kept_total), timeout=WAIT) == BIG  # unchanged
        assert q.push_and_wait(Job("drop", jobs_arrays.drop_kept), timeout=WAIT) is None
        q.push_and_wait(Job("third", jobs_arrays.total, args=(second,)), timeout=WAIT)
        assert len(segments()) == 2  # (no third)
    assert segments() == []


def test_a_small_argument_stays_in_the_pipe() -> None:
    with open_queue(1) as q:
        small = np.arange(100, dtype=np.float64)
        came = q.push_and_wait(Job("s", jobs_arrays.how_it_came, args=(small,)), timeout=WAIT)
        assert came == (small.sum(), False, True)


def test_a_large_result_is_a_view_of_a_mapping_freed_with_it() -> None:
    with open_queue(1) as q:
        no_trim(q)
        out = q.push_and_wait(Job("r", jobs_arrays.zeros, args=(BIG,)), timeout=WAIT)
        assert out.shape == (BIG,) and out.flags.writeable
        assert jobs_arrays.in_segment(out)  # no copy: the supervisor maps the worker's segment
        assert len(result_segments()) == 1  # its worker's, kept to write its next large result into
        out[:] = 7  # (writable, as any unpickled array)
        assert q.forget("r")
        del out
        gc.collect()
        assert jobs_arrays.mapped_ranges() == []  # the memory went with the last object made from it


def test_a_result_too_large_for_the_lane_leaves_no_segment() -> None:
    with open_queue({"a": Lane(workers=1, max_result_bytes=OOB_BYTES)}) as q:
        with pytest.raises(JobFailed, match="max_result_bytes") as info:
            q.push_and_wait(Job("big", jobs_arrays.zeros, args=(BIG,)), timeout=WAIT)
        assert info.value.failure.kind == "protocol"
        assert result_segments() == []


def test_an_untrusted_lane_takes_large_arguments_in_the_pipe() -> None:
    with open_queue({"u": Lane(workers=1, trusted=False)}) as q:
        value = b"u" * (OOB_BYTES * 2)
        # (Its result comes back as JSON: the length says the bytes arrived whole.)
        assert q.push_and_wait(Job("u", len, args=(value,)), timeout=WAIT) == len(value)
        assert segments() == []  # (none made: an untrusted job's arguments stay in the pipe)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sandboxes are Linux's")
def test_a_sandboxed_job_cannot_reach_another_jobs_segment(gates: Gates) -> None:
    gate = gates("held")
    with open_queue({"t": 1, "s": Lane(workers=1, trusted=False, sandbox=Sandbox())}) as q:
        job = Job("held", jobs_arrays.hold, args=(np.ones(BIG), gate.started, gate.go), lane="t")
        held = q.push(job).handle
        gate.wait_started()
        [name] = segments()  # the held job's argument, mapped by its worker
        seen = q.push_and_wait(Job("peek", jobs_arrays.peek_segment, args=(name,), lane="s"), timeout=WAIT)
        assert seen == {"listed": [], "open": "FileNotFoundError"}
        gate.open()
        assert held.result(timeout=WAIT) == BIG


def test_with_no_room_for_a_segment_arguments_go_in_the_pipe(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    with open_queue(1) as q:
        monkeypatch.setattr("procq._wire.shm.SHM_DIR", str(tmp_path / "gone"))  # (as a full /dev/shm refuses)
        array = np.arange(BIG, dtype=np.float64)
        came = q.push_and_wait(Job("no room", jobs_arrays.how_it_came, args=(array,)), timeout=WAIT)
        assert came == (array.sum(), False, True)


def test_with_no_room_for_a_segment_a_result_goes_in_the_pipe() -> None:
    with open_queue(1) as q:
        out = q.push_and_wait(Job("no room", jobs_arrays.ones_with_no_room, args=(BIG,)), timeout=WAIT)
        q.push_and_wait(Job("room", jobs_arrays.room), timeout=WAIT)
        assert np.array_equal(out, np.ones(BIG)) and not jobs_arrays.in_segment(out)


@pytest.mark.parametrize(
    "value",
    [b"b" * OOB_BYTES, bytearray(OOB_BYTES), memoryview(b"m" * OOB_BYTES), ({"k": [b"n" * OOB_BYTES]}, None)],
    ids=["bytes", "bytearray", "memoryview", "bytes nested in arguments"],
)
def test_large_bytes_leave_the_pickle(value: Any) -> None:
    from procq._wire.oob import dumps_oob
    from procq._wire.protocol import dumps_fn

    data, buffers = dumps_oob(value, dumps_fn)
    assert len(data) < 1000 and sum(b.raw().nbytes for b in buffers) == OOB_BYTES
    import pickle

    same(value, pickle.loads(data, buffers=[b.raw() for b in buffers]))
