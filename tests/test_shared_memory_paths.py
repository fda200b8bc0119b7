"""Large arrays through every way in: ``q.map`` (whose default keys digest an
array where it lies), ``Executor.map`` and the joblib backend all hand a
worker its arrays as views of shared memory."""

from __future__ import annotations

import itertools
import os

import jobs_arrays
import numpy as np
import pytest
from core_support import WAIT, open_queue
from test_shared_memory import BIG, segments

from procq import Executor, Job
from procq._wire.fingerprint import content_key
from procq._wire.shm import segment_prefix

try:
    import joblib
except ImportError:
    if os.environ.get("CI") == "true":  # CI installs procq[joblib]: there it is a broken install
        raise
    joblib = None


def _arrays(n: int) -> list[np.ndarray]:
    return [np.full(BIG, float(i)) for i in range(n)]


def test_map_without_keys() -> None:
    arrays = _arrays(4)
    with open_queue(2) as q:
        out = list(q.map(jobs_arrays.how_it_came, arrays, timeout=WAIT))
    assert segments() == []
    assert out == [(a.sum(), True, True) for a in arrays]
    assert segments() == []


def test_the_default_key_of_an_array_follows_its_content_dtype_and_shape() -> None:
    a = np.arange(BIG, dtype=np.float64)
    key = content_key(jobs_arrays.total, a)
    assert content_key(jobs_arrays.total, a.copy()) == key
    changed = a.copy()
    changed[-1] += 1
    others = [changed, a.view(np.int64), a.reshape(2, -1), {"a": a}, a.tobytes()]
    keys = {key, *(content_key(jobs_arrays.total, other) for other in others)}
    assert len(keys) == len(others) + 1
    assert content_key(jobs_arrays.total, a.tobytes()) == content_key(jobs_arrays.total, a.tobytes())


def test_a_map_of_large_arrays_keeps_a_bounded_number_of_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past its bytes in shared memory, a map keeps only two jobs per worker
    out: the 40 arrays go through a few segments, written again and again,
    not 40 (its window of items alone would let all 40 out)."""
    import procq._api.map

    monkeypatch.setattr(procq._api.map, "SHARED_AHEAD", 4 * BIG * 8)  # four arrays' worth
    arrays = _arrays(40)
    prefix = segment_prefix()
    with open_queue(2) as q:
        seen = list(q.map(jobs_arrays.argument_segments, arrays, itertools.repeat(prefix), timeout=WAIT))
    assert len(seen) == 40
    # At most five out (four's worth, and the one pushed as the bound was reached), and up to four kept idle.
    assert max(seen) <= 9, seen
    assert segments() == []


def test_executor_map() -> None:
    arrays = _arrays(3)
    with Executor(max_workers=2) as ex:
        out = list(ex.map(jobs_arrays.how_it_came, arrays, timeout=WAIT))
    assert out == [(a.sum(), True, True) for a in arrays]
    assert segments() == []


@pytest.mark.skipif(joblib is None, reason="joblib is not installed (pip install 'procq[joblib]')")
def test_the_joblib_backend() -> None:
    import procq.joblib  # (registers the backend)

    arrays = _arrays(3)
    with joblib.parallel_backend("procq", n_jobs=2):
        out = joblib.Parallel()(joblib.delayed(jobs_arrays.how_it_came)(a) for a in arrays)
    assert out == [(a.sum(), True, True) for a in arrays]
    procq.joblib.shutdown()  # its workers are kept for the next call, and the segments they reuse
    assert segments() == []


def test_a_large_bytes_argument_is_never_copied_in_the_supervisor() -> None:
    """A 64 MiB ``bytes`` argument goes to the worker through shared memory,
    written there once: neither its key's fingerprint (too large to read,
    known from its length) nor its pickle (lifted out of band before
    pickling) makes a copy of it in the supervisor's heap."""
    import tracemalloc

    data = os.urandom(64 << 20)
    with open_queue(1) as q:
        assert q.push_and_wait(Job("warm", len, args=(b"x",)), timeout=WAIT) == 1
        tracemalloc.start()
        try:
            assert q.push_and_wait(Job("big", len, args=(data,)), timeout=WAIT) == len(data)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 8 << 20, f"the push allocated {peak / (1 << 20):.1f} MiB"
