"""Times far in the future: a ``not_before``, a job's or lane's ``timeout``, a
retry's backoff or a wait as long as a ``datetime`` or a float can hold must
never break the queue: the I/O thread sleeps towards them like any other."""

from __future__ import annotations

import datetime
from typing import Any

import jobs
import pytest
from core_support import failure_of, open_queue

from procq import Failed, Job, Lane, Pending, Retry
from procq._model.settings import MAX_KILL_GRACE

FAR_DATETIMES = [
    datetime.datetime(2030, 1, 1),
    datetime.datetime(9999, 12, 31, 23, 59, 59),
    datetime.datetime.max.replace(tzinfo=datetime.timezone.utc),
]


def assert_still_serving(q: Any) -> None:
    assert not q.closed
    assert q.push_and_wait(Job("still-serving", jobs.square, args=(9,))) == 81
    q._check_invariants()


@pytest.mark.parametrize("when", FAR_DATETIMES, ids=["2030", "year-9999", "datetime.max-utc"])
def test_a_far_not_before_waits_without_breaking_the_queue(when: datetime.datetime) -> None:
    with open_queue(1) as q:
        q.push(Job("later", jobs.square, args=(2,), not_before=when))
        assert q.state("later") == Pending()
        assert_still_serving(q)
        assert q.state("later") == Pending()
        assert q.cancel("later")
        assert isinstance(q.state("later"), Failed)


@pytest.mark.parametrize("delay", [30 * 86400.0, 1e12, 1e300])
def test_a_far_not_before_delay_waits_without_breaking_the_queue(delay: float) -> None:
    with open_queue(1) as q:
        q.push(Job("later", jobs.square, args=(2,), not_before=delay))
        assert_still_serving(q)
        assert q.state("later") == Pending()


def test_waking_a_far_scheduled_job_runs_it() -> None:
    with open_queue(1) as q:
        q.push(Job("later", jobs.square, args=(3,), not_before=datetime.datetime(9999, 1, 1)))
        outcome = q.push(Job("later", jobs.square, args=(3,), not_before=0.0), wake=True)
        assert outcome.handle.result(timeout=30) == 9


@pytest.mark.parametrize("seconds", [30 * 86400.0, 1e12, 1e300])
def test_a_far_job_timeout_lets_the_job_finish(seconds: float) -> None:
    with open_queue(1) as q:
        assert q.push_and_wait(Job("long-limit", jobs.square, args=(4,), timeout=seconds)) == 16
        assert_still_serving(q)


@pytest.mark.parametrize("seconds", [30 * 86400.0, 1e300])
def test_a_far_lane_timeout_lets_jobs_finish(seconds: float) -> None:
    with open_queue({"slow": Lane(workers=1, timeout=seconds, kill_grace=MAX_KILL_GRACE)}) as q:
        assert q.push_and_wait(Job("lane-limit", jobs.square, args=(5,))) == 25
        assert_still_serving(q)


def test_a_far_retry_backoff_keeps_the_key_pending() -> None:
    retry = Retry(attempts=2, backoff=1e12, max_backoff=1e12, jitter=0.0)
    with open_queue(1) as q:
        q.push(Job("flaky", jobs.boom, retry=retry))
        # One worker: by the time a later job has run, the first attempt's
        # failure was settled, and the key waits out its backoff.
        assert_still_serving(q)
        assert q.state("flaky") == Pending(attempt=2)
        assert_still_serving(q)
        assert q.cancel("flaky")


@pytest.mark.parametrize("seconds", [1e10, 1e300])
def test_waiting_for_a_result_with_a_far_timeout(seconds: float) -> None:
    with open_queue(1) as q:
        handle = q.push(Job("quick", jobs.square, args=(6,))).handle
        assert handle.result(timeout=seconds) == 36
        assert q.push_and_wait(Job("quick2", jobs.square, args=(7,)), timeout=seconds) == 49


@pytest.mark.parametrize("seconds", [1e10, 1e300])
def test_pushing_with_a_far_timeout_for_room(seconds: float) -> None:
    with open_queue({"one": Lane(workers=1, capacity=1)}) as q:
        outcome = q.push(Job("room", jobs.square, args=(8,)), timeout=seconds)
        assert outcome.handle.result(timeout=30) == 64


EDGE_DATETIMES = [
    datetime.datetime.max,  # naive: local time
    datetime.datetime.max.replace(tzinfo=datetime.timezone(datetime.timedelta(hours=-23, minutes=-59))),
    datetime.datetime.max.replace(tzinfo=datetime.timezone(datetime.timedelta(hours=23, minutes=59))),
]


@pytest.mark.parametrize("when", EDGE_DATETIMES, ids=["naive-max", "max-utc-minus-23:59", "max-utc-plus-23:59"])
def test_the_latest_datetimes_in_any_zone_wait(when: datetime.datetime) -> None:
    with open_queue(1) as q:
        q.push(Job("later", jobs.square, args=(2,), not_before=when))
        assert_still_serving(q)
        assert q.state("later") == Pending()


@pytest.mark.parametrize(
    "when",
    [datetime.datetime.min, datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)],
    ids=["naive-min", "min-utc"],
)
def test_the_earliest_datetimes_run_at_once(when: datetime.datetime) -> None:
    with open_queue(1) as q:
        assert q.push_and_wait(Job("past", jobs.square, args=(3,), not_before=when), timeout=30) == 9


def test_the_longest_kill_grace_still_ends_a_timed_out_job() -> None:
    # SIGTERM ends the job at its timeout; the SIGKILL a grace later is never needed.
    # (A longer grace is refused: see test_close_grace.)
    with open_queue({"graceful": Lane(workers=1, timeout=0.2, kill_grace=MAX_KILL_GRACE)}) as q:
        failure_of(q.push(Job("slow", jobs.sleep, args=(60,))).handle, "timeout", timeout=30)
        assert_still_serving(q)


@pytest.mark.parametrize(
    "retry",
    [
        Retry(attempts=3, backoff=1e300, factor=1e300, max_backoff=1.7e308, jitter=1.0),
        Retry(attempts=10**9, backoff=1.0, factor=10, max_backoff=1e300, jitter=0.0),
    ],
    ids=["huge-backoff-and-jitter", "huge-factor-power"],
)
def test_a_retry_backoff_past_what_a_float_holds_keeps_the_key_pending(retry: Retry) -> None:
    with open_queue(1) as q:
        q.push(Job("flaky", jobs.boom, retry=retry))
        assert_still_serving(q)
        assert q.state("flaky") == Pending(attempt=2)
        assert q.cancel("flaky")


def test_a_retry_deep_into_a_huge_factor_is_capped() -> None:
    retry = Retry(attempts=10**9, backoff=1.0, factor=10, max_backoff=7.0, jitter=0.0)
    assert retry.delay(10**8, 0.5) == 7.0
    assert Retry(backoff=0.0, factor=1e300, jitter=0.0).delay(5000, 0.5) == 0.0


@pytest.mark.parametrize("seconds", [1e10, 1e300])
def test_awaiting_with_a_far_timeout(seconds: float) -> None:
    import asyncio

    async def main(q: Any) -> None:
        assert await q.apush_and_wait(Job("a", jobs.square, args=(2,)), timeout=seconds) == 4
        outcome = await q.apush(Job("b", jobs.square, args=(3,)), timeout=seconds)
        assert await asyncio.wait_for(outcome.handle, 30) == 9

    with open_queue(1) as q:
        asyncio.run(main(q))
