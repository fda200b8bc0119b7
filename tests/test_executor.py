"""procq.Executor beyond the stdlib's own tests: crashes, keys, initializer, options, futures."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import multiprocessing
import pickle
import threading
import time
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import executor_jobs as ej
import pytest

import procq
from procq import Executor, InitializerFailed, JobFailed, JobPicklingError, Lane, Processing


def _wait_until_running(ex: Executor, future: cf.Future[object]) -> None:
    key = future.key  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while not isinstance(ex.queue.state(key), Processing):
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.01)


def test_is_a_real_executor_and_future() -> None:
    with Executor(1) as ex:
        assert isinstance(ex, cf.Executor)
        future = ex.submit(pow, 2, 8)
        assert isinstance(future, cf.Future)
        assert future.result(timeout=30) == 256


def test_a_crash_fails_only_its_own_future_as_job_failed_and_broken_process_pool() -> None:
    with Executor(2) as ex:
        crash = ex.submit(ej.segfault)
        fine = [ex.submit(ej.mul, i, 2) for i in range(6)]
        error = crash.exception(timeout=30)
        assert isinstance(error, JobFailed) and isinstance(error, BrokenProcessPool)
        assert error.failure.kind == "crashed"
        assert error.failure.signal == "SIGSEGV" and error.failure.exitcode == -11
        assert "SIGSEGV" in str(error)
        with pytest.raises(BrokenProcessPool, match="SIGSEGV"):
            crash.result()
        assert [f.result(timeout=30) for f in fine] == [0, 2, 4, 6, 8, 10]
        assert ex.submit(ej.mul, 3, 3).result(timeout=30) == 9  # not broken


def test_a_result_that_cannot_be_pickled_raises_what_pickling_it_raised() -> None:
    """As ``ProcessPoolExecutor``: the error pickling the result raised, itself."""
    with Executor(1) as ex:
        with pytest.raises(pickle.PicklingError, match="Error in pickle"):
            ex.submit(ej.return_instance, ej.ErrorAtPickle).result(timeout=30)
        with pytest.raises(TypeError, match=r"cannot pickle '_thread\.lock' object"):
            ex.submit(threading.Lock).result(timeout=30)
        assert ex.submit(ej.mul, 2, 2).result(timeout=30) == 4


@pytest.mark.parametrize("func", [ej.exit_1, ej.raise_keyboard_interrupt], ids=["SystemExit", "KeyboardInterrupt"])
def test_a_jobs_base_exception_is_raised_as_itself(func: object) -> None:
    expected = SystemExit if func is ej.exit_1 else KeyboardInterrupt
    with Executor(1) as ex:
        future = ex.submit(func)  # type: ignore[arg-type]
        with pytest.raises(expected):
            future.result(timeout=30)
        assert type(future.exception()) is expected
        with pytest.raises(SystemExit):  # raised while its result was pickled
            ex.submit(ej.return_instance, ej.ExitAtPickle).result(timeout=30)
        assert ex.submit(ej.mul, 2, 3).result(timeout=30) == 6  # the worker survived: no crash


def test_arguments_that_cannot_be_pickled_fail_the_future_not_submit() -> None:
    with Executor(1) as ex:
        future = ex.submit(ej.mul, threading.Lock(), 2)
        error = future.exception(timeout=30)
        assert isinstance(error, JobPicklingError)
        assert isinstance(error, pickle.PicklingError) and isinstance(error, TypeError)
        assert "its arguments could not be pickled" in str(error)
        assert ex.submit(ej.mul, 2, 2).result(timeout=30) == 4


def _rebuilding_program(
    make_pool: Callable[[], cf.Executor], items: list[int]
) -> tuple[dict[int, int], list[int], int]:
    """A program written for ProcessPoolExecutor: on BrokenProcessPool it
    rebuilds its pool and submits again what failed, up to twice an item.
    Returns the answers, the items that broke (every time they were
    submitted) and how many pools it built."""
    answers: dict[int, int] = {}
    broke: list[int] = []
    tries = dict.fromkeys(items, 0)
    pools = 1
    pool = make_pool()
    todo = list(items)
    try:
        while todo:
            futures = {x: pool.submit(ej.square_or_crash, x) for x in todo}
            todo = []
            broken = False
            for x, future in futures.items():
                try:
                    answers[x] = future.result(timeout=60)
                except BrokenProcessPool:
                    broken = True
                    broke.append(x)
                    tries[x] += 1
                    if tries[x] < 2:
                        todo.append(x)
            if broken and todo:
                pool.shutdown(wait=True)
                pool = make_pool()
                pools += 1
    finally:
        pool.shutdown(wait=True)
    return answers, broke, pools


def test_a_program_that_rebuilds_its_pool_on_broken_process_pool_keeps_working() -> None:
    """The crash is the only job that fails (each time it runs): no healthy
    job fails, so none is retried, and every answer is right."""
    items = [*range(10), -1, *range(10, 20)]  # -1 crashes its worker
    answers, broke, pools = _rebuilding_program(lambda: Executor(3), items)
    assert answers == {x: x * x for x in items if x != -1}
    assert broke == [-1, -1]  # only the crash, once per attempt
    assert pools == 2


def test_a_job_that_raised_sets_its_own_exception() -> None:
    with Executor(1) as ex:
        with pytest.raises(ZeroDivisionError) as info:
            ex.submit(divmod, 1, 0).result(timeout=30)
        assert "Traceback" in str(info.value.__cause__)  # the child's traceback, as in the stdlib


def test_procq_key_dedups_and_kwargs_named_key_reach_fn() -> None:
    with Executor(1) as ex:
        assert ex.submit(sorted, [3, 1, 2], key=lambda x: -x).result(timeout=30) == [3, 2, 1]
        first = ex.submit(ej.mul, 6, 7, procq_key="answer")
        assert first.result(timeout=30) == 42
        again = ex.submit(ej.mul, 6, 7, procq_key="answer")
        assert again.done() and again.result() == 42
        assert ex.queue.keys(prefix="answer") == ["answer"]


def test_generated_keys_are_forgotten_once_resolved() -> None:
    with Executor(1) as ex:
        for i in range(5):
            assert ex.submit(ej.mul, i, i).result(timeout=30) == i * i
        ex.submit(int).result(timeout=30)
        deadline = time.monotonic() + 30  # (forgotten by a callback that may run just after result())
        while ex.queue.keys() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ex.queue.keys() == []


def test_initializer_runs_in_each_worker_before_its_first_job() -> None:
    with Executor(1, initializer=ej.remember, initargs=("ready",)) as ex:
        assert ex.submit(ej.initialized).result(timeout=30) == ["ready"]
        assert ex.submit(ej.initialized).result(timeout=30) == ["ready"]  # once per worker


def test_max_tasks_per_child_replaces_workers_and_reruns_the_initializer() -> None:
    with Executor(1, initializer=ej.remember, initargs=(1,), max_tasks_per_child=2) as ex:
        pids = [ex.submit(ej.getpid).result(timeout=30) for _ in range(4)]
        assert pids[0] == pids[1] != pids[2] == pids[3]
        assert ex.submit(ej.initialized).result(timeout=30) == [1]


def test_a_failing_initializer_fails_the_job_and_names_it() -> None:
    with Executor(1, initializer=ej.fail_init) as ex:
        with pytest.raises(InitializerFailed, match=r"initializer fail_init\(\) failed .* no database here") as info:
            ex.submit(int).result(timeout=30)
        assert isinstance(info.value, BrokenProcessPool)  # what ProcessPoolExecutor raises for it
        with pytest.raises(InitializerFailed):  # the next job tries again
            ex.submit(int).result(timeout=30)


def test_an_untrusted_lanes_jobs_carry_the_initializer() -> None:
    """An untrusted lane runs each job in a fresh process: the executor's
    initializer travels with each job there and runs before it."""
    with Executor(lanes={"u": Lane(trusted=False)}, initializer=ej.remember, initargs=("untrusted",)) as ex:
        assert ex.submit(ej.initialized).result(timeout=30) == ["untrusted"]


def test_a_lane_with_an_initializer_of_its_own_is_refused() -> None:
    with pytest.raises(ValueError, match="lane 'a' has an initializer of its own"):
        Executor(lanes={"a": Lane(initializer=ej.remember, initargs=(1,))}, initializer=ej.remember)


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="max_workers must be greater than 0"):
        Executor(0)
    with pytest.raises(TypeError, match="initializer must be a callable"):
        Executor(1, initializer=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_tasks_per_child must be >= 1"):
        Executor(1, max_tasks_per_child=0)
    with pytest.raises(ValueError, match="either lanes or max_workers"):
        Executor(2, lanes=2)
    with pytest.raises(ValueError, match="'fork' is not supported"):
        Executor(1, mp_context="fork")


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_mp_context_picks_the_start_method(method: str) -> None:
    with Executor(1, mp_context=multiprocessing.get_context(method)) as ex:
        assert ex.queue.start_method == method
        assert ex.submit(abs, -1).result(timeout=30) == 1


def test_procq_options_reach_the_jobs() -> None:
    with Executor(lanes={"a": Lane(workers=1), "b": 1}, timeout=0.5) as ex:
        with pytest.raises(JobFailed) as info:
            ex.submit(ej.wait_for_file, "/nonexistent/never", procq_lane="b").result(timeout=30)
        assert info.value.failure.kind == "timeout"


def test_cancel_cancels_only_a_call_not_yet_handed_to_the_queue(tmp_path: Path) -> None:
    """As ``ProcessPoolExecutor``'s call queue: a lane's workers + 1 calls are
    handed over (RUNNING, not cancellable); the rest wait in the executor."""
    go = tmp_path / "go"
    with Executor(1) as ex:
        blocker = ex.submit(ej.wait_for_file, str(go))
        handed = ex.submit(ej.mul, 1, 1)
        waiting = ex.submit(ej.mul, 2, 2)
        _wait_until_running(ex, blocker)
        assert blocker.running() and handed.running() and not waiting.running()
        assert ex.queue.stats().lanes["default"].waiting == 1  # (handed, in the lane; waiting is not)
        assert not handed.cancel()
        assert not blocker.cancel()  # running: like the stdlib, no
        assert waiting.cancel() and waiting.cancelled()
        go.touch()
        blocker.result(timeout=30)
        assert handed.result(timeout=30) == 1
        with pytest.raises(cf.CancelledError):
            waiting.result()
        assert ex.submit(ej.mul, 3, 3).result(timeout=30) == 9


def test_shutdown_cancel_futures_lets_the_handed_over_calls_finish(tmp_path: Path) -> None:
    go = tmp_path / "go"
    ex = Executor(2)
    try:
        held = [ex.submit(ej.wait_for_file, str(go)) for _ in range(2)]
        handed = ex.submit(ej.mul, 2, 3)
        rest = [ex.submit(ej.mul, i, 1) for i in range(20)]
        for future in held:
            _wait_until_running(ex, future)
        ex.shutdown(wait=False, cancel_futures=True)
        assert all(f.cancelled() for f in rest)
        assert not handed.cancelled()
        go.touch()
        assert handed.result(timeout=30) == 6 and [f.result(timeout=30) for f in held] == [None, None]
    finally:
        go.touch()
        ex.shutdown()


def test_a_window_of_workers_plus_one_per_lane_and_the_rest_in_order() -> None:
    with Executor(2) as ex:
        futures = [ex.submit(ej.mul, i, 2) for i in range(50)]
        ex._feed.check_invariants()
        assert [f.result(timeout=30) for f in futures] == [2 * i for i in range(50)]
        ex._feed.check_invariants()
    with Executor(lanes={"a": 1, "b": 2}) as ex:
        a = [ex.submit(ej.mul, i, 1, procq_lane="a") for i in range(6)]
        b = [ex.submit(ej.mul, i, 1, procq_lane="b") for i in range(6)]
        assert [f.result(timeout=30) for f in a + b] == list(range(6)) * 2
        with pytest.raises(ValueError, match="unknown lane 'c'"):
            ex.submit(int, procq_lane="c")


def test_callbacks_wait_and_asyncio() -> None:
    seen: list[int] = []
    with Executor(2) as ex:
        future = ex.submit(ej.mul, 2, 3)
        future.add_done_callback(lambda f: seen.append(f.result()))
        done, _ = cf.wait([future], timeout=30)
        assert done == {future}

        async def main() -> int:
            return await asyncio.wrap_future(ex.submit(ej.mul, 4, 5))

        assert asyncio.run(main()) == 20
    assert seen == [6]


def test_submit_from_a_done_callback() -> None:
    with Executor(1) as ex:
        chained: list[cf.Future[int]] = []
        submitted = threading.Event()

        def chain(f: cf.Future[int]) -> None:
            chained.append(ex.submit(ej.mul, f.result(), 10))
            submitted.set()

        ex.submit(ej.mul, 1, 2).add_done_callback(chain)
        assert submitted.wait(30)
        assert chained[0].result(timeout=30) == 20


def test_shutdown_without_wait_finishes_the_jobs() -> None:
    ex = Executor(1)
    futures = [ex.submit(ej.mul, i, 1) for i in range(3)]
    ex.shutdown(wait=False)
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(int)
    assert [f.result(timeout=30) for f in futures] == [0, 1, 2]
    assert ex._closer is not None
    ex._closer.join(30)


def test_exported() -> None:
    assert procq.Executor is Executor
    assert procq.as_completed is not None


def test_the_call_queues_thread_ends_once_nothing_waits_and_keeps_no_executor_alive() -> None:
    import gc
    import weakref

    ex = Executor(1)
    queue = ex.queue
    try:
        futures = [ex.submit(ej.mul, i, 2) for i in range(10)]  # 8 wait for room: a feed thread hands them over
        assert [f.result(timeout=30) for f in futures] == [2 * i for i in range(10)]
        ref = weakref.ref(ex)
        del ex, futures
        gc.collect()
        assert ref() is None
    finally:
        queue.close()


def test_a_failing_initializer_on_an_untrusted_lane_fails_its_job_and_names_it() -> None:
    """There the initializer travels with each job (``Initialized``) and runs
    in the job's own process: the job fails, naming it, and the next job of
    the lane (a fresh process) runs it again."""
    named = r"InitializerFailed: the initializer fail_init\(\) failed .* no database"
    with Executor(lanes={"u": Lane(trusted=False)}, initializer=ej.fail_init) as ex:
        for _ in range(2):
            with pytest.raises(JobFailed, match=named):
                ex.submit(int).result(timeout=30)
