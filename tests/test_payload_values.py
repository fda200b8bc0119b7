"""The payload check on values at its edges: very large text falls back to the
function alone, as documented, and a value that is not equal to itself (NaN)
still fingerprints the same when the same job is built again."""

from __future__ import annotations

import math

import jobs
import pytest
from core_support import WAIT, open_queue

from procq import Cached, InFlight, Job


def identity_pair(a: object, b: object) -> object:
    return a


@pytest.mark.parametrize(
    "big",
    [lambda c: c * (1 << 20) + "x", lambda c: (c * (1 << 20) + "x").encode()],
    ids=["str", "bytes"],
)
def test_arguments_past_a_mebibyte_fall_back_to_the_function_alone(big: object) -> None:
    with open_queue(1) as q:
        first = big("a")  # type: ignore[operator]
        second = big("b")  # type: ignore[operator]
        q.push_and_wait(Job("big", jobs.identity, args=(first,)))
        outcome = q.push(Job("big", jobs.identity, args=(second,)))
        assert isinstance(outcome, Cached)  # no KeyConflict: too large to compare
        assert outcome.output == first


def test_two_large_arguments_together_past_a_mebibyte_fall_back_too() -> None:
    half = 600 * 1024
    with open_queue(1) as q:
        q.push_and_wait(Job("two", identity_pair, args=("a" * half, "b" * half)))
        assert isinstance(q.push(Job("two", identity_pair, args=("c" * half, "d" * half))), Cached)


@pytest.mark.parametrize("shape", ["flat", "nested", "keyword"])
def test_a_nan_argument_rebuilt_does_not_conflict_with_itself(shape: str) -> None:
    def build() -> Job[object]:
        nan = float("nan")  # a new NaN object each time
        if shape == "flat":
            return Job("nan", jobs.identity, args=(nan,))
        if shape == "nested":
            return Job("nan", jobs.identity, args=([1, nan],))
        return Job("nan", jobs.identity, kwargs={"x": nan})

    with open_queue(1) as q:
        out = q.push_and_wait(build(), timeout=WAIT)
        outcome = q.push(build())
        assert isinstance(outcome, (Cached, InFlight))
        if shape == "flat":
            assert math.isnan(out)


def test_other_arguments_still_conflict() -> None:
    from procq import KeyConflict

    with open_queue(1) as q:
        q.push_and_wait(Job("k", jobs.identity, args=(float("nan"),)))
        with pytest.raises(KeyConflict):
            q.push(Job("k", jobs.identity, args=(1.5,)))
        q.push_and_wait(Job("s", jobs.identity, args=("a" * 1000,)))
        with pytest.raises(KeyConflict):
            q.push(Job("s", jobs.identity, args=("b" * 1000,)))
