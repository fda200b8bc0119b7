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
    # (Not open_queue(...).__enter__(): the dropped context manager would close the queue at once.)
    q = ProcQueue({"cpu": 2})
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


def _release_and_close(q: ProcQueue, gate: str) -> None:
    import os

    fd = jobs.release(gate)
    try:
        q.close(wait=False)
    finally:
        os.close(fd)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "unordered"])
@pytest.mark.parametrize("chunksize", [1, 2])
@pytest.mark.parametrize("keep", [False, True], ids=["forget", "keep"])
def test_every_kind_of_map_cancels_what_it_left(tmp_path: Path, ordered: bool, chunksize: int, keep: bool) -> None:
    gate = jobs.fifo(tmp_path, "gate")
    log = str(tmp_path / "log")
    q = ProcQueue({"cpu": 2})
    try:
        fn = functools.partial(hj.first_free_rest_gated, gate=gate, log=log)
        items = [0] * chunksize + list(range(1, 30))  # the first job is free, every other one waits for the gate
        it = q.map(fn, items, ordered=ordered, chunksize=chunksize, keep=keep)
        assert next(it) == 0
        it.close()  # type: ignore[attr-defined]
        _no_job_left(q)
        states = [q.state(k) for k in q.keys(prefix=None)]
        if keep:  # the job it handed out is kept; every other one it claimed ended cancelled
            assert sum(isinstance(s, Failed) and s.failure.kind == "cancelled" for s in states) == len(states) - 1
        else:
            assert states == []  # nothing of the map's is left behind
        _close_within(q, 20)
        assert not Path(log).exists() or not [line for line in read_log(log) if line.startswith("finished")]
    finally:
        _release_and_close(q, gate)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "unordered"])
def test_a_map_ended_by_a_failure_cancels_the_rest(tmp_path: Path, ordered: bool) -> None:
    gate = jobs.fifo(tmp_path, "gate")
    log = str(tmp_path / "log")
    q = ProcQueue({"cpu": 2})
    try:

        def fail_first(item: int) -> int:  # (travels by value)
            if item == 0:
                hj.fail_on("boom")
            return hj.first_free_rest_gated(item, gate, log)

        with pytest.raises(JobFailed, match=r"^map item 0 \(0\): job 'map:"):
            list(q.map(fail_first, range(20), ordered=ordered))
        _no_job_left(q)
        assert q.keys() == []
        _close_within(q, 20)
    finally:
        _release_and_close(q, gate)


def test_a_failed_chunk_names_its_items() -> None:
    items = ["a", "b", "boom-1", "d"]
    with open_queue(1) as q:
        with pytest.raises(JobFailed, match=r"^map items 2-3 \(a chunk; item 2 is 'boom-1'\): job 'map-chunk:") as info:
            list(q.map(hj.fail_on, items, chunksize=2))
        assert isinstance(info.value.__cause__, ValueError)  # the job's own exception, as on a handle
        assert info.value.failure.kind == "error" and info.value.item is not None
        outs = list(q.map(hj.fail_on, items, chunksize=2, return_failures=True))
        assert outs[:2] == ["A", "B"]
        assert [str(o).split(": job")[0] for o in outs[2:]] == [
            "map item 2 ('boom-1'), in the chunk of items 2-3",
            "map item 3 ('d'), in the chunk of items 2-3",
        ]


def test_an_items_repr_is_short_and_never_fails() -> None:
    from procq._api.map import ITEM_REPR, _short

    class Unprintable:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert _short(Unprintable()).startswith("<Unprintable ")
    assert len(_short(list(range(10**6)))) <= ITEM_REPR
    assert len(_short({"k" * 1000: "v" * 1000})) <= ITEM_REPR
    assert _short(7) == "7"
