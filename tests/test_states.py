"""The four states of a key and JobHandle.

Every "it ran" / "nothing ran" claim is proven from inside the children: the
jobs append ``"<tag> <pid>"`` to a log file (see jobs_core.py).
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import jobs
import jobs_core
import pytest
from core_support import WAIT, Gates, awaited, open_queue, read_log, within

from procq import (
    Cached,
    Completed,
    Failed,
    InFlight,
    Job,
    JobFailed,
    Pending,
    Processing,
    ProcQueue,
    Queued,
)

# --- the table, row by row ------------------------------------------------------


def test_a_new_key_is_queued_and_runs_once_in_a_child(queue: ProcQueue, log: str) -> None:
    assert queue.state("fresh") is None
    outcome = queue.push(Job("fresh", jobs_core.record, args=(log,)))
    assert type(outcome) is Queued
    handle = outcome.handle
    assert handle.key == "fresh"
    pid = handle.result(timeout=WAIT)
    assert pid != os.getpid()
    assert read_log(log) == [f"ran {pid}"]
    assert handle.done()
    assert handle.state == Completed(pid)
    assert queue.state("fresh") == Completed(pid)


def test_unknown_keys_have_no_state(queue: ProcQueue, log: str) -> None:
    assert queue.state("nobody") is None
    queue.push_and_wait(Job("somebody", jobs_core.record, args=(log,)), timeout=WAIT)
    assert queue.state("nobody") is None
    # Keys are compared exactly.
    assert queue.state("somebody ") is None
    assert queue.state("Somebody") is None
    assert isinstance(queue.state("somebody"), Completed)


@pytest.mark.key_decides  # pushes other work under a held key on purpose: on_mismatch="ignore"
def test_pending_and_processing_keys_are_joined_as_inflight(queue: ProcQueue, gates: Gates, log: str) -> None:
    gate = gates("held")
    # The io lane has one worker: "held" occupies it, "behind" waits behind it.
    held = queue.push(Job("held", jobs_core.record_signal_wait, args=(log, gate.started, gate.go), lane="io"))
    assert type(held) is Queued
    pid = gate.wait_started()
    assert queue.state("held") == Processing()
    assert held.handle.state == Processing()
    behind = queue.push(Job("behind", jobs_core.record, args=(log, "behind"), lane="io"))
    assert type(behind) is Queued
    assert queue.state("behind") == Pending()
    assert behind.handle.state == Pending()

    # Pushing either key again joins it, whatever the new job says: the key decides.
    join_held = queue.push(Job("held", jobs_core.record, args=(log, "duplicate")))
    join_behind = queue.push(Job("behind", jobs_core.record, args=(log, "duplicate"), lane="cpu"))
    assert type(join_held) is InFlight and type(join_behind) is InFlight
    assert join_held.handle.key == "held" and join_behind.handle.key == "behind"
    assert join_held.handle.state == Processing()
    assert join_behind.handle.state == Pending()
    assert not join_held.handle.done() and not join_behind.handle.done()
    stats = queue.stats()
    assert (stats.pending, stats.processing) == (1, 1)

    gate.open()
    assert held.handle.result(timeout=WAIT) == pid
    assert join_held.handle.result(timeout=WAIT) == pid
    # "behind" ran in the io lane's only worker, after "held".
    assert behind.handle.result(timeout=WAIT) == pid
    assert join_behind.handle.result(timeout=WAIT) == pid
    assert read_log(log) == [f"ran {pid}", f"behind {pid}"]  # no duplicate ran
    assert queue.state("held") == Completed(pid)
    assert queue.state("behind") == Completed(pid)


@pytest.mark.key_decides  # pushes other work under a held key on purpose: on_mismatch="ignore"
def test_a_completed_key_answers_cached_and_nothing_runs(queue: ProcQueue, log: str) -> None:
    first = queue.push(Job("done", jobs_core.record, args=(log,)))
    assert type(first) is Queued
    pid = first.handle.result(timeout=WAIT)

    again = queue.push(Job("done", jobs_core.record, args=(log, "again")))
    assert type(again) is Cached
    assert again == Cached(pid)
    # A different function under the same key: still the stored output, nothing runs.
    other = queue.push(Job("done", jobs_core.boom_logged, args=(log, "must not run"), lane="io"))
    assert other == Cached(pid)
    assert queue.push_and_wait(Job("done", jobs_core.record, args=(log, "wait")), timeout=WAIT) == pid

    assert read_log(log) == [f"ran {pid}"]
    assert queue.state("done") == Completed(pid)
    stats = queue.stats()
    assert (stats.completed, stats.lanes["cpu"].completed, stats.lanes["io"].completed) == (1, 1, 0)


@pytest.mark.key_decides  # pushes other work under a held key on purpose: on_mismatch="ignore"
def test_a_cached_output_is_the_stored_value(queue: ProcQueue) -> None:
    value = {"nested": [1, 2.5, "three", (4, None)], "bytes": b"\x00\xff"}
    assert queue.push_and_wait(Job("value", jobs.identity, args=(value,)), timeout=WAIT) == value
    cached = queue.push(Job("value", jobs.identity, args=("something else",)))
    assert cached == Cached(value)
    assert queue.state("value") == Completed(value)


def test_a_failed_key_is_queued_fresh_and_runs_again(queue: ProcQueue, log: str) -> None:
    first = queue.push(Job("flaky", jobs_core.boom_logged, args=(log, "first try")))
    assert type(first) is Queued
    with pytest.raises(JobFailed, match=r"^job 'flaky' failed: error: ValueError: first try$"):
        first.handle.result(timeout=WAIT)
    state = queue.state("flaky")
    assert isinstance(state, Failed)
    assert state.failure.kind == "error"
    assert state.failure.exc_type == "ValueError"
    assert state.failure.message == "ValueError: first try"
    assert first.handle.state == state

    second = queue.push(Job("flaky", jobs_core.record, args=(log,)))
    assert type(second) is Queued
    pid = second.handle.result(timeout=WAIT)
    lines = read_log(log)
    assert len(lines) == 2 and lines[0].startswith("boom ") and lines[1] == f"ran {pid}"
    assert queue.state("flaky") == Completed(pid)
    # The first handle still refers to the run it was given for.
    assert first.handle.state == state
    with pytest.raises(JobFailed, match="first try"):
        first.handle.result(timeout=WAIT)
    assert second.handle.state == Completed(pid)
    stats = queue.stats()
    assert (stats.completed, stats.failed) == (1, 0)
    assert (stats.lanes["cpu"].completed, stats.lanes["cpu"].failed) == (1, 1)


def test_the_four_states_round_under_each_start_method(start_method: str, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    with open_queue({"main": 1}, start_method=start_method) as q:
        assert q.start_method == start_method
        queued = q.push(Job("k", jobs_core.record, args=(log,)))
        assert type(queued) is Queued
        pid = queued.handle.result(timeout=WAIT)
        assert pid != os.getpid()
        assert q.state("k") == Completed(pid)
        assert q.push(Job("k", jobs_core.record, args=(log,))) == Cached(pid)

        failing = q.push(Job("f", jobs.boom, args=("no",)))
        assert type(failing) is Queued
        with pytest.raises(JobFailed, match=r"^job 'f' failed: error: ValueError: no$"):
            failing.handle.result(timeout=WAIT)
        assert isinstance(q.state("f"), Failed)
        retry = q.push(Job("f", jobs_core.record, args=(log, "retry")))
        assert type(retry) is Queued
        assert retry.handle.result(timeout=WAIT) == pid
        assert read_log(log) == [f"ran {pid}", f"retry {pid}"]


# --- JobHandle ------------------------------------------------------------------


def test_result_timeout_raises_and_leaves_the_job_running(queue: ProcQueue, gates: Gates, log: str) -> None:
    gate = gates("slow")
    handle = queue.push(Job("slow", jobs_core.record_signal_wait, args=(log, gate.started, gate.go))).handle
    pid = gate.wait_started()
    with pytest.raises(TimeoutError, match=r"^job 'slow' has not finished after 0\.1s; it keeps running$"):
        handle.result(timeout=0.1)
    with pytest.raises(TimeoutError, match="job 'slow' has not finished"):
        handle.result(timeout=0)
    assert not handle.done()
    assert handle.state == Processing()
    assert queue.state("slow") == Processing()
    gate.open()
    assert handle.result(timeout=WAIT) == pid
    assert handle.done()
    assert read_log(log) == [f"ran {pid}"]  # the same run finished; nothing restarted


def test_many_handles_on_one_job_all_resolve_to_its_output(queue: ProcQueue, gates: Gates, log: str) -> None:
    gate = gates("shared")
    job = Job("shared", jobs_core.record_signal_wait, args=(log, gate.started, gate.go))
    handles = [queue.push(job).handle]
    pid = gate.wait_started()
    for _ in range(4):
        outcome = queue.push(job)
        assert type(outcome) is InFlight
        handles.append(outcome.handle)

    # Every handle waited on at once, each from its own thread.
    results: dict[int, int] = {}

    def wait_for(i: int) -> None:
        results[i] = handles[i].result(timeout=WAIT)

    threads = [threading.Thread(target=wait_for, args=(i,)) for i in range(len(handles))]
    for t in threads:
        t.start()
    assert not any(h.done() for h in handles)
    gate.open()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()
    assert results == {i: pid for i in range(len(handles))}
    assert all(h.done() and h.state == Completed(pid) for h in handles)
    assert read_log(log) == [f"ran {pid}"]


def test_many_handles_on_one_failed_job_all_raise_its_failure(queue: ProcQueue, gates: Gates) -> None:
    gate = gates("bad")
    job = Job("bad", jobs_core.signal_wait_boom, args=(gate.started, gate.go, "shared failure"), lane="io")
    first = queue.push(job)
    assert type(first) is Queued
    gate.wait_started()
    joined = [queue.push(job) for _ in range(3)]
    assert all(type(o) is InFlight for o in joined)
    gate.open()
    failures = []
    for handle in [first.handle] + [o.handle for o in joined]:
        with pytest.raises(JobFailed, match=r"^job 'bad' failed: error: ValueError: shared failure$") as info:
            handle.result(timeout=WAIT)
        assert info.value.key == "bad"
        failures.append(info.value.failure)
    state = queue.state("bad")
    assert isinstance(state, Failed)
    assert all(f == state.failure for f in failures)


def test_await_handle(queue: ProcQueue, gates: Gates, log: str) -> None:
    gate = gates("awaited")
    job = Job("awaited", jobs_core.record_signal_wait, args=(log, gate.started, gate.go))
    first = queue.push(job)
    pid = gate.wait_started()
    joined = queue.push(job)
    assert type(first) is Queued and type(joined) is InFlight

    async def main() -> None:
        tasks = [asyncio.create_task(awaited(o.handle)) for o in (first, joined)]
        await asyncio.sleep(0)  # let both tasks start waiting
        assert not any(t.done() for t in tasks)
        gate.open()
        assert await within(asyncio.gather(*tasks)) == [pid, pid]
        # Awaiting a handle whose job already ended returns at once.
        assert await first.handle == pid
        failing = queue.push(Job("awaited-boom", jobs.boom, args=("async failure",)))
        with pytest.raises(JobFailed, match=r"^job 'awaited-boom' failed: error: ValueError: async failure$"):
            await within(awaited(failing.handle))
        with pytest.raises(JobFailed, match="async failure"):
            await failing.handle

    asyncio.run(main())
    assert read_log(log) == [f"ran {pid}"]
