"""Retries with backoff, scheduled jobs (not_before) and push(wake=True).

Long backoffs and far schedules keep a job waiting for as long as a test
needs; short ones (0) let it go at once. No test waits on a timer for a
measured time: each waits for the job itself, bounded."""

from __future__ import annotations

import datetime
from typing import Any

import jobs
import jobs_lifecycle
import pytest
from core_support import WAIT, Gates, open_queue

from procq import (
    Failed,
    InFlight,
    Job,
    JobFailed,
    Lane,
    Pending,
    Processing,
    Queued,
    Retry,
)

FAR = 3600.0


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"attempts": 0}, ValueError, r"^Retry needs at least 1 attempt, got 0$"),
        ({"attempts": 2.0}, TypeError, r"^Retry attempts must be an int, got float$"),
        ({"backoff": -1}, ValueError, r"^Retry backoff must be >= 0, got -1$"),
        ({"factor": 0.5}, ValueError, r"^Retry factor must be >= 1"),
        ({"jitter": 2}, ValueError, r"^Retry jitter must be between 0 and 1, got 2$"),
        ({"max_backoff": float("inf")}, TypeError, r"^Retry max_backoff must be a finite number, got inf$"),
        (
            {"on": ("error", "cancelled")},
            ValueError,
            r"^Retry on cannot include 'cancelled': a cancelled job is never retried$",
        ),
        (
            {"on": ("eror",)},
            ValueError,
            r"^Retry on: unknown failure kind 'eror'; "
            r"the kinds are 'crashed', 'error', 'interrupted', 'memory', 'protocol', 'timeout'$",
        ),
    ],
)
def test_retry_rejects_bad_settings(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Retry(**kwargs)


def test_retry_takes_every_failure_kind_but_cancelled() -> None:
    assert Retry(on=("memory", "protocol", "timeout")).on == ("memory", "protocol", "timeout")
    assert Retry().on == ("crashed", "timeout", "error")
    assert Retry(on=["error"]).on == ("error",)
    with pytest.raises(TypeError, match=r"^job 'k': retry must be a procq.Retry or None, got int$"):
        Job("k", jobs.identity, retry=3)  # type: ignore[arg-type]


def test_the_backoff_grows_by_factor_up_to_its_maximum_with_jitter() -> None:
    r = Retry(backoff=1, factor=2, max_backoff=5, jitter=0.5)
    assert [r.delay(n, 0.5) for n in (1, 2, 3, 4)] == [1, 2, 4, 5]
    assert (r.delay(1, 0.0), r.delay(3, 0.0)) == (0.5, 2.0)


def test_pending_counts_attempts_and_pending_is_attempt_one() -> None:
    assert Pending() == Pending(attempt=1) != Pending(attempt=2)


@pytest.mark.parametrize("how", ["raise", "crash"])
def test_a_failing_attempt_is_retried_until_it_succeeds(tmp_path: Any, how: str) -> None:
    counter = str(tmp_path / "n")
    with open_queue(1) as q:
        job = Job("k", jobs_lifecycle.flaky, args=(counter, 2, how), retry=Retry(attempts=3, backoff=0))
        assert q.push_and_wait(job, timeout=WAIT) == "ok"
        assert jobs_lifecycle.attempts(counter) == 3
        stats = q.stats()
        assert (stats.completed, stats.failed, stats.lanes["default"].retries) == (1, 0, 2)


def test_the_key_fails_after_the_last_attempt_saying_why_each_failed(tmp_path: Any) -> None:
    counter = str(tmp_path / "n")
    with open_queue(1) as q:
        job = Job("k", jobs_lifecycle.flaky, args=(counter, 9), retry=Retry(attempts=3, backoff=0))
        with pytest.raises(JobFailed) as info:
            q.push_and_wait(job, timeout=WAIT)
        failure = info.value.failure
        assert (failure.kind, failure.attempts) == ("error", 3)
        assert [f.message for f in failure.history] == [f"ValueError: attempt {n} failed" for n in (1, 2, 3)]
        assert failure.message == (
            "ValueError: attempt 3 failed [3 attempts, all failed: #1 error: ValueError: attempt 1 failed; "
            "#2 error: ValueError: attempt 2 failed; #3 error: ValueError: attempt 3 failed]"
        )
        assert q.state("k") == Failed(failure)
        assert jobs_lifecycle.attempts(counter) == 3


def test_a_kind_not_in_on_is_not_retried(tmp_path: Any) -> None:
    counter = str(tmp_path / "n")
    with open_queue(1) as q:
        job = Job("k", jobs_lifecycle.flaky, args=(counter, 1), retry=Retry(attempts=3, backoff=0, on=("crashed",)))
        with pytest.raises(JobFailed) as info:
            q.push_and_wait(job, timeout=WAIT)
        assert info.value.failure.attempts == 1 and info.value.failure.history == ()
        assert jobs_lifecycle.attempts(counter) == 1


def test_between_attempts_the_key_is_pending_with_its_attempt_and_joinable(tmp_path: Any) -> None:
    counter = str(tmp_path / "n")
    with open_queue(1) as q:
        job = Job("k", jobs_lifecycle.flaky, args=(counter, 1), retry=Retry(attempts=2, backoff=FAR, jitter=0))
        first = q.push(job)
        assert type(first) is Queued
        # One worker runs jobs in order: once a job pushed after it has run,
        # the first attempt has failed and the second waits out its backoff.
        assert q.push_and_wait(Job("after", jobs.identity, args=(0,)), timeout=WAIT) == 0
        entry = q._core.keys.live["k"]
        assert q.state("k") == Pending(attempt=2)
        assert first.handle.state == Pending(attempt=2) and not first.handle.done()
        joined = q.push(job, wake=True)  # a wake never shortens a backoff
        assert type(joined) is InFlight
        assert q._core.keys.live["k"] is entry and entry.attempt == 2
        due = entry.due
        q.push(Job("k", jobs_lifecycle.flaky, args=(counter, 1)), wake=True)
        assert entry.due == due and q.state("k") == Pending(attempt=2)
        q.close(wait=False)
        with pytest.raises(JobFailed) as info:
            joined.handle.result(timeout=WAIT)
        failure = info.value.failure
        assert failure.kind == "cancelled" and failure.attempts == 2
        assert failure.history[0].message == "ValueError: attempt 1 failed"


def test_a_scheduled_job_waits_and_a_wake_starts_it_at_once(gates: Gates) -> None:
    with open_queue(1) as q:
        late = Job("k", jobs.identity, args=(1,), not_before=FAR)
        outcome = q.push(late)
        assert type(outcome) is Queued and q.state("k") == Pending()
        assert type(q.push(late)) is InFlight and q.state("k") == Pending()  # no wake: still waiting
        entry = q._core.keys.live["k"]
        due = entry.due
        q.push(Job("k", jobs.identity, args=(1,), not_before=2 * FAR), wake=True)  # never later
        assert entry.due == due
        q.push(Job("k", jobs.identity, args=(1,), not_before=FAR / 2), wake=True)  # earlier, not now
        assert entry.due is not None and entry.due < due and q.state("k") == Pending()
        woken = q.push(Job("k", jobs.identity, args=(1,)), wake=True)  # now
        assert type(woken) is InFlight and woken.handle.result(timeout=WAIT) == 1
        assert outcome.handle.result() == 1
        assert type(q.push(late, wake=True)).__name__ == "Cached"  # repeated wakes change nothing


def test_a_short_delay_runs_on_its_timer() -> None:
    with open_queue(1) as q:
        assert q.push_and_wait(Job("k", jobs.identity, args=(2,), not_before=0.01), timeout=WAIT) == 2


def test_a_datetime_in_the_past_runs_at_once_and_one_far_ahead_waits() -> None:
    with open_queue(1) as q:
        past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
        assert q.push_and_wait(Job("past", jobs.identity, args=(3,), not_before=past), timeout=WAIT) == 3
        ahead = datetime.datetime.now() + datetime.timedelta(hours=1)
        assert type(q.push(Job("ahead", jobs.identity, args=(4,), not_before=ahead))) is Queued
        assert q.state("ahead") == Pending()
        q.close(wait=False)
        state = q.state("ahead")
        assert isinstance(state, Failed) and state.failure.kind == "cancelled"


def test_not_before_is_checked() -> None:
    with pytest.raises(ValueError, match=r"^job 'k': not_before as a delay must be a number of seconds >= 0, got -1$"):
        Job("k", jobs.identity, not_before=-1)
    with pytest.raises(
        TypeError, match=r"^job 'k': not_before must be a datetime, a delay in seconds or None, got str$"
    ):
        Job("k", jobs.identity, not_before="soon")  # type: ignore[arg-type]


def test_a_job_that_falls_due_in_a_full_lane_waits_for_room_ahead_of_blocked_pushes(gates: Gates) -> None:
    gate = gates("busy")
    with open_queue({"w": Lane(workers=1, capacity=0)}) as q:
        busy = q.push(Job("busy", jobs.signal_and_wait, args=(gate.started, gate.go)))
        gate.wait_started()
        scheduled = q.push(Job("s", jobs.identity, args=(5,), not_before=FAR))
        woken = q.push(Job("s", jobs.identity, args=(5,)), wake=True)  # due now, but no room
        assert type(woken) is InFlight and q.state("s") == Pending()
        assert q.stats().lanes["w"].waiting == 1
        q._check_invariants()
        gate.open()
        assert type(scheduled) is Queued and scheduled.handle.result(timeout=WAIT) == 5
        assert type(busy) is Queued and busy.handle.result(timeout=WAIT) > 0
        assert q.state("busy") != Processing()


def test_apush_with_wake_starts_a_scheduled_holder() -> None:
    import asyncio

    async def main() -> Any:
        first = await q.apush(Job("k", jobs.identity, args=(6,), not_before=FAR))
        assert type(first) is Queued and q.state("k") == Pending()
        woken = await q.apush(Job("k", jobs.identity, args=(6,)), wake=True)
        assert type(woken) is InFlight
        return await woken.handle

    with open_queue(1) as q:
        assert asyncio.run(main()) == 6
