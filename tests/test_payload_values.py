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


# --- The classes behind those examples, read straight from the fingerprint ------


def _fp(*args: object, **kwargs: object) -> bytes:
    from procq._wire.fingerprint import fingerprint

    return fingerprint(jobs.identity, args, kwargs or None)


def _nans() -> list[float]:
    inf = float("inf")
    return [float("nan"), math.nan, inf - inf, -float("nan"), float("-nan")]  # inf - inf: a negative NaN on x86


@pytest.mark.parametrize(
    "shape",
    [
        lambda n: ((n,), {}), lambda n: ((1, n, "x"), {}), lambda n: (([n],), {}), lambda n: (((n, (n,)),), {}),
        lambda n: (({"a": n},), {}), lambda n: (({n},), {}), lambda n: ((), {"x": n}), lambda n: ((complex(n, 1),), {}),
    ],
    ids=["flat", "flat-mixed", "list", "tuple", "dict", "set", "keyword", "complex"],
)  # fmt: skip
def test_every_nan_reads_the_same_wherever_it_is(shape: object) -> None:
    prints = {_fp(*args, **kwargs) for args, kwargs in map(shape, _nans())}  # type: ignore[call-overload]
    assert len(prints) == 1 and len(next(iter(prints))) == 16  # arguments were read, and every NaN matches


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (-1, -2),  # hash(-1) == hash(-2)
        (0, 2**61 - 1),  # equal modulo 2**61 - 1, as hash() reads ints
        (0.5, 2.0**60),  # hash(0.5) == hash(2.0**60)
        (1.0, 2.0**-61),
        (0.0, -0.0),
        (1, 1.0), (1, True), ("1", b"1"), ("", None),
    ],
)  # fmt: skip
@pytest.mark.parametrize("where", ["flat", "nested", "keyword"])
def test_different_values_never_read_the_same(a: object, b: object, where: str) -> None:
    def fp(v: object) -> bytes:
        return {"flat": lambda: _fp(v, 1), "nested": lambda: _fp([v]), "keyword": lambda: _fp(x=v)}[where]()

    assert len(fp(a)) == len(fp(b)) == 16
    assert fp(a) != fp(b)


def test_a_huge_int_is_read_or_falls_back_without_error() -> None:
    big = 10**5000  # past the 4,300 digits Python turns into text
    assert len(_fp(big)) == 16 and _fp(big) != _fp(big + 1)
    assert len(_fp([big])) == 16 and _fp([big]) != _fp([big + 1])
    assert len(_fp([2 ** (8 * (1 << 20) + 8)])) == 8  # over a mebibyte of digits: the function alone


@pytest.mark.parametrize("where", ["flat", "nested", "keyword"])
@pytest.mark.parametrize("kind", [str, bytes])
def test_text_past_a_mebibyte_falls_back_wherever_it_is(where: str, kind: type) -> None:
    def fp(*texts: object) -> bytes:
        return {"flat": lambda: _fp(*texts), "nested": lambda: _fp(list(texts)), "keyword": lambda: _fp(t=texts)}[
            where
        ]()

    def text(n: int, c: str = "a") -> object:
        return kind(c * n) if kind is str else (c * n).encode()

    assert len(fp(text(1000))) == 16
    assert fp(text(1000)) != fp(text(1000, "b"))
    assert len(fp(text((1 << 20) + 1))) == 8  # one argument past it
    assert len(fp(*[text(300 * 1024)] * 4)) == 8  # several, together past it
