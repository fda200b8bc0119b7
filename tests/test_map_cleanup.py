"""``q.map`` cleans up after itself: a consumer that stops early (breaks,
raises, closes the iterator) leaves none of the map's jobs running or
waiting; and a failed item says which item it was."""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any

import jobs
import jobs_hardening as hj
import pytest
from core_support import open_queue, read_log

from procq import Failed, JobFailed, ProcQueue


def _close_within(q: ProcQueue, seconds: float) -> None:
    closer = threading.Thread(target=q.close, daemon=True)
    closer.start()
    closer.join(timeout=seconds)
    assert not closer.is_alive(), "close() waited for jobs the map had left running"


def _no_job_left(q: ProcQueue) -> None:
    stats = q.stats()
    assert stats.pending == 0 and stats.processing == 0, stats


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stop", ["break", "raise", "close", "del"])
def test_a_consumer_that_stops_early_leaves_nothing_running(tmp_path: Path, stop: str) -> None:
    gate = jobs.fifo(tmp_path, "gate")
    log = str(tmp_path / "log")
    q = open_queue({"cpu": 2}).__enter__()
    try:
        fn = functools.partial(hj.first_free_rest_gated, gate=gate, log=log)
        keys: list[str] = []

        def key(item: int) -> str:
            keys.append(f"item:{item}")
            return keys[-1]

        if stop == "break":
            for out in q.map(fn, range(40), key=key):
                assert out == 0
                break
        elif stop == "raise":
            with pytest.raises(RuntimeError):
                for _ in q.map(fn, range(40), key=key):
                    raise RuntimeError("the consumer failed")
        else:
            it = q.map(fn, range(40), key=key)
            assert next(it) == 0
            if stop == "close":
                it.close()  # type: ignore[attr-defined]
            else:
                del it
        assert len(keys) > 1  # the map had pushed more than it yielded
        _no_job_left(q)
        for k in keys[1:]:
            state = q.state(k)
            assert state is None or (isinstance(state, Failed) and state.failure.kind == "cancelled"), (k, state)
        _close_within(q, 20)
        assert not [line for line in read_log(log) if line.startswith("finished")] if Path(log).exists() else True
    finally:
        fd = jobs.release(gate)
        q.close(wait=False)
        import os

        os.close(fd)


def test_a_map_left_early_does_not_cancel_keys_it_only_joined(tmp_path: Path) -> None:
    gate = jobs.fifo(tmp_path, "gate")
    log = str(tmp_path / "log")
    with open_queue({"cpu": 2}) as q:
        fn = functools.partial(hj.first_free_rest_gated, gate=gate, log=log)
        # Someone else's job holds item 1's key: the map joins it, and must not cancel it.
        from procq import Job

        theirs = q.push(Job("item:1", fn, args=(1,))).handle
        for out in q.map(fn, range(3), key=lambda i: f"item:{i}"):
            assert out == 0
            break
        assert not theirs.done()
        fd = jobs.release(gate)
        try:
            assert theirs.result(timeout=30) == 1
        finally:
            import os

            os.close(fd)


@pytest.mark.parametrize("return_failures", [False, True])
def test_a_failed_item_says_which_item(return_failures: bool) -> None:
    items = ["a", "b", "boom-" + "x" * 500, "d"]
    with open_queue(1) as q:
        if return_failures:
            outs: list[Any] = list(q.map(hj.fail_on, items, return_failures=True))
            error = outs[2]
            assert isinstance(error, JobFailed)
        else:
            with pytest.raises(JobFailed) as info:
                list(q.map(hj.fail_on, items))
            error = info.value
        text = str(error)
        assert "item 2" in text, text
        assert "'boom-xxx" in text and len(text) < 1000, text  # a short repr of the item
        assert error.failure.kind == "error"
