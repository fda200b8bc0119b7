"""Bad arguments raise at once, where they are given: to Job, Lane, ProcQueue and push, which then
claims nothing. Keys are non-empty str, and a Job is a frozen value."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jobs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from procq import Job, Lane, ProcQueue


def noop() -> None:
    """A module-level function to build jobs with."""


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: Job(1, noop), TypeError, r"^job key must be a str, got int: 1$"),  # type: ignore[arg-type]
        (lambda: Job(b"k", noop), TypeError, r"^job key must be a str, got bytes: b'k'$"),  # type: ignore[arg-type]
        (lambda: Job(None, noop), TypeError, r"^job key must be a str, got NoneType: None$"),  # type: ignore[arg-type]
        (lambda: Job("", noop), ValueError, r"^job key must be a non-empty str$"),
        (lambda: Job("k", 3), TypeError, r"^job 'k': fn must be callable, got int: 3$"),  # type: ignore[arg-type]
        (lambda: Job("k", "f"), TypeError, r"^job 'k': fn must be callable, got str: 'f'$"),  # type: ignore[arg-type]
        (lambda: Job("k", noop, args="ab"), TypeError, r"^job 'k': args must be a tuple or list, got str$"),
        (lambda: Job("k", noop, args=1), TypeError, r"^job 'k': args must be a tuple or list, got int$"),  # type: ignore[arg-type]
        (lambda: Job("k", noop, kwargs=[1]), TypeError, r"^job 'k': kwargs must be a mapping or None, got list$"),  # type: ignore[arg-type]
        (lambda: Job("k", noop, kwargs={1: 2}), TypeError, r"^job 'k': kwargs keys must be str, got 1$"),  # type: ignore[dict-item]
        (lambda: Job("k", noop, lane=1), TypeError, r"^job 'k': lane must be a str or None, got int$"),  # type: ignore[arg-type]
        (
            lambda: Job("k", noop, timeout="1"),  # type: ignore[arg-type]
            TypeError,
            r"^job 'k': timeout must be a number of seconds or None, got str$",
        ),
        (
            lambda: Job("k", noop, timeout=True),
            TypeError,
            r"^job 'k': timeout must be a number of seconds or None, got bool$",
        ),
        (
            lambda: Job("k", noop, timeout=0),
            ValueError,
            r"^job 'k': timeout must be a positive number of seconds, got 0$",
        ),
        (
            lambda: Job("k", noop, timeout=-1.5),
            ValueError,
            r"^job 'k': timeout must be a positive number of seconds, got -1\.5$",
        ),
        (
            lambda: Job("k", noop, timeout=math.nan),
            ValueError,
            r"^job 'k': timeout must be a positive number of seconds, got nan$",
        ),
        (
            lambda: Job("k", noop, timeout=math.inf),
            ValueError,
            r"^job 'k': timeout must be a positive number of seconds, got inf$",
        ),
        (lambda: Lane(workers=0), ValueError, r"^a lane needs at least 1 worker, got 0$"),
        (lambda: Lane(workers=-2), ValueError, r"^a lane needs at least 1 worker, got -2$"),
        (lambda: Lane(workers=1.5), TypeError, r"^lane workers must be an int, got float$"),  # type: ignore[arg-type]
        (lambda: Lane(capacity=-1), ValueError, r"^a lane's capacity must be 0 or more, got -1$"),
        (lambda: Lane(capacity=None), TypeError, r"^lane capacity must be an int, got NoneType$"),  # type: ignore[arg-type]
        (lambda: ProcQueue(lanes=0), ValueError, r"^lanes=0: a queue needs at least 1 worker$"),
        (lambda: ProcQueue(lanes=-3), ValueError, r"^lanes=-3: a queue needs at least 1 worker$"),
        (lambda: ProcQueue(lanes={}), ValueError, r"^lanes must name at least one lane$"),
        (lambda: ProcQueue(lanes={"io": 0}), ValueError, r"^lane 'io' needs at least 1 worker, got 0$"),
        (
            lambda: ProcQueue(lanes={"io": "2"}),  # type: ignore[dict-item]
            TypeError,
            r"^lane 'io': expected an int or a Lane, got str$",
        ),
        (lambda: ProcQueue(lanes={"": 1}), TypeError, r"^lane names must be non-empty str, got ''$"),
        (
            lambda: ProcQueue(lanes="cpu"),  # type: ignore[arg-type]
            TypeError,
            r"^lanes must be an int or a mapping of lane names to int or Lane, got str$",
        ),
        (
            lambda: ProcQueue(lanes=True),
            TypeError,
            r"^lanes must be an int or a mapping of lane names to int or Lane, got bool$",
        ),
        (
            lambda: ProcQueue(lanes=1, start_method="fork"),
            ValueError,
            r"^start method 'fork' is not supported: the supervisor runs a thread",
        ),
        (
            lambda: ProcQueue(lanes=1, start_method="bogus"),
            ValueError,
            r"^unknown start method 'bogus'; this platform has .*forkserver",
        ),
    ],
)
def test_bad_arguments_raise_at_once(make: Callable[[], Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        make()


def test_a_key_that_is_a_str_subclass_is_kept_as_a_plain_str() -> None:
    class Key(str):
        pass

    key = Job(Key("k"), noop).key
    assert key == "k" and type(key) is str


def test_a_job_is_a_frozen_value() -> None:
    job = Job("k", jobs.square, args=[3], kwargs={"x": 1}, lane="cpu", timeout=2)
    assert (job.key, job.fn, job.args, job.kwargs, job.lane, job.timeout) == (
        "k",
        jobs.square,
        (3,),
        {"x": 1},
        "cpu",
        2.0,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.key = "other"  # type: ignore[misc]
    assert job == Job("k", jobs.square, args=(3,), kwargs={"x": 1}, lane="cpu", timeout=2.0)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.text(min_size=1))
def test_any_nonempty_str_is_a_key(key: str) -> None:
    assert Job(key, noop).key == key


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.one_of(st.integers(), st.binary(), st.floats(), st.none(), st.lists(st.text()), st.tuples(st.text())))
def test_a_key_that_is_not_a_str_is_refused(key: Any) -> None:
    with pytest.raises(TypeError, match=r"^job key must be a str, got "):
        Job(key, noop)


def test_push_refuses_bad_arguments_at_once_and_claims_nothing(queue: ProcQueue) -> None:
    with pytest.raises(ValueError, match=r"^job 'k': unknown lane 'gpu'; this queue's lanes are 'cpu', 'io'$"):
        queue.push(Job("k", jobs.getpid, lane="gpu"))
    with pytest.raises(ValueError, match=r"^job 'k': unknown lane 'gpu'; this queue's lanes are 'cpu', 'io'$"):
        queue.push_and_wait(Job("k", jobs.getpid, lane="gpu"))
    with pytest.raises(TypeError, match=r"^push\(\) takes a procq\.Job, got tuple$"):
        queue.push(("k", jobs.getpid))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^push\(\) takes a procq\.Job, got function$"):
        queue.push_and_wait(jobs.getpid)  # type: ignore[arg-type]

    async def main() -> None:
        with pytest.raises(ValueError, match=r"^job 'k': unknown lane 'gpu'"):
            await queue.apush(Job("k", jobs.getpid, lane="gpu"))
        with pytest.raises(TypeError, match=r"^push\(\) takes a procq\.Job, got str$"):
            await queue.apush("k")  # type: ignore[arg-type]

    asyncio.run(main())
    assert queue.state("k") is None
    stats = queue.stats()
    assert (stats.pending, stats.processing, stats.completed, stats.failed) == (0, 0, 0, 0)


@pytest.mark.parametrize("timeout", ["soon", [1]])
def test_push_refuses_a_timeout_that_is_not_a_number(queue: ProcQueue, timeout: Any) -> None:
    # A bad argument raises at once, even when the lane has room.
    with pytest.raises(TypeError, match="timeout"):
        queue.push(Job("k", jobs.getpid), timeout=timeout)
    assert queue.state("k") is None
