"""How a job's function reaches its worker: lambdas, closures and local functions run in a child
with the values they have when pushed; a module-level function is pickled once per queue."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jobs
import jobs_core
import pytest
from core_support import WAIT, open_queue

import procq
import procq._api.push
from procq import Job, ProcQueue


def make_adder(n: int) -> Callable[[int], int]:
    def add(x: int) -> int:
        return x + n

    return add


def test_lambdas_closures_and_local_functions_run_in_a_child(start_method: str) -> None:
    me = os.getpid()
    scale = 3

    def local(x: int) -> tuple[int, int]:
        return x * scale, os.getpid()

    with open_queue({"main": 1}, start_method=start_method) as q:
        value, pid = q.push_and_wait(Job("lambda", lambda x: (x * 3, os.getpid()), args=(4,)), timeout=WAIT)
        assert value == 12 and pid != me
        assert q.push_and_wait(Job("local", local, args=(5,)), timeout=WAIT) == (15, pid)
        assert q.push_and_wait(Job("closure-1", make_adder(1), args=(10,)), timeout=WAIT) == 11
        assert q.push_and_wait(Job("closure-2", make_adder(2), args=(10,)), timeout=WAIT) == 12
        # As arguments: a lambda and a local function travel by value too.
        assert q.push_and_wait(Job("arg-lambda", jobs_core.apply, args=(lambda v: v * 2, 21)), timeout=WAIT) == (
            42,
            pid,
        )
        assert q.push_and_wait(Job("arg-local", jobs_core.apply, args=(local, 2)), timeout=WAIT) == ((6, pid), pid)
        assert q.push_and_wait(Job("closure-kwargs", make_adder(100), kwargs={"x": 1}), timeout=WAIT) == 101
        assert q.push_and_wait(Job("lambda-kwargs", lambda *, a, b: a - b, kwargs={"a": 10, "b": 3}), timeout=WAIT) == 7


def test_many_distinct_closures_in_one_worker_each_run_their_own_code() -> None:
    # More distinct functions than a worker keeps unpickled, twice over, in one
    # worker: each job must run its own function, never a cached neighbour's.
    adders = [make_adder(n) for n in range(150)]
    with open_queue(1) as q:
        handles = [q.push(Job(f"add-{n}", fn, args=(1000,))).handle for n, fn in enumerate(adders)]
        handles += [q.push(Job(f"again-{n}", fn, args=(2000,))).handle for n, fn in enumerate(adders)]
        results = [h.result(timeout=WAIT) for h in handles]
    assert results == [1000 + n for n in range(150)] + [2000 + n for n in range(150)]


def test_runs_of_one_function_between_many_others_each_run_their_own_code() -> None:
    # Jobs sent ahead in frames of several: runs of one module-level function
    # (its id touched once per run in the supervisor's copy of the worker's
    # function cache) between more distinct closures than the cache holds. The
    # two copies must stay alike, or a job runs another's function or none.
    adders = [make_adder(n) for n in range(200)]
    work: list[tuple[Any, int, int]] = []
    for n, add in enumerate(adders):
        work += [(jobs.square, n, n * n)] * (1 + n % 4)
        work.append((add, 1000, 1000 + n))
        work += [(jobs.identity, n, n)] * (n % 3)
    with open_queue(1) as q:
        handles = [q.push(Job(f"job-{i}", fn, args=(arg,))).handle for i, (fn, arg, _) in enumerate(work)]
        results = [h.result(timeout=WAIT) for h in handles]
    assert results == [want for _, _, want in work]


@pytest.mark.parametrize("change", ["rebound", "mutated"])
def test_a_function_runs_with_the_values_it_has_when_pushed(queue: ProcQueue, change: str) -> None:
    # As with concurrent.futures: what runs is fn as it is at push time. A
    # closure whose captured variable was rebound, or whose captured object was
    # changed, must not run with the values of an earlier push.
    n = 0
    items: list[int] = []

    def current() -> int:
        return n if change == "rebound" else sum(items)

    seen = []
    for i in range(3):
        if change == "rebound":
            n = i
        else:
            items.append(i)
        expected = current()
        seen.append((expected, queue.push_and_wait(Job(f"current-{i}", current), timeout=WAIT)))
    assert [got for _, got in seen] == [want for want, _ in seen]


def test_a_module_level_function_is_pickled_once_per_queue(queue: ProcQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    real = procq._api.push.dumps_fn
    pickled: list[object] = []

    def counting(fn: object) -> bytes:
        pickled.append(fn)
        return real(fn)

    monkeypatch.setattr(procq._api.push, "dumps_fn", counting)
    outputs = [queue.push_and_wait(Job(f"sq:{i}", jobs.square, args=(i,)), timeout=20) for i in range(6)]
    assert outputs == [i * i for i in range(6)]
    assert pickled == [jobs.square]

    # A closure is pickled at every push: it runs with what it captures now.
    base = 10
    add = lambda x: x + base  # noqa: E731
    first = queue.push_and_wait(Job("add:1", add, args=(1,)), timeout=20)
    base = 20
    second = queue.push_and_wait(Job("add:2", add, args=(1,)), timeout=20)
    assert (first, second) == (11, 21)
    assert pickled == [jobs.square, add, add]
