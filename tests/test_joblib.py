"""The joblib backend (``procq.joblib``) driven by joblib itself: results as
the sequential backend's, a crashing batch failing the call with the signal
named while the next call works, ``n_jobs`` as a bound on concurrency, nested
calls, the options, and a scikit-learn workload when scikit-learn is installed.
The autouse leak check (conftest) holds every test to leaving no worker
behind once the backend's shared queue is shut down.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import psutil
import pytest

try:
    import joblib
except ImportError:
    if os.environ.get("CI") == "true":  # CI installs procq[joblib]: there it is a broken install
        raise
    pytest.skip("joblib is not installed (pip install 'procq[joblib]')", allow_module_level=True)

import jobs_joblib
from core_support import wait_until
from joblib import Parallel, delayed

import procq.joblib
from procq import JobFailed, Retry
from procq.joblib import ProcqBackend


@pytest.fixture(autouse=True)
def _shared_queue_closed() -> Iterator[None]:
    """The backend keeps its workers for the next call, as loky does: close
    them after each test, before the leak check."""
    yield
    procq.joblib.shutdown()


def test_results_equal_the_sequential_backends() -> None:
    with joblib.parallel_config(backend="sequential"):
        expected = Parallel()(delayed(math.sqrt)(i) for i in range(1000))
    with joblib.parallel_config(backend="procq", n_jobs=2):
        got = Parallel()(delayed(math.sqrt)(i) for i in range(1000))
    assert got == expected


def test_batches_run_in_worker_processes_not_here() -> None:
    out = Parallel(n_jobs=2, backend="procq", batch_size=1)(delayed(jobs_joblib.square_and_pid)(i) for i in range(20))
    assert [square for square, _ in out] == [i * i for i in range(20)]
    pids = {pid for _, pid in out}
    assert os.getpid() not in pids
    assert 1 <= len(pids) <= 2


@pytest.mark.parametrize("name", ["SIGSEGV", "SIGKILL"])
def test_a_crashing_batch_fails_the_call_naming_the_signal_and_the_next_call_works(name: str) -> None:
    signum = jobs_joblib.SIGNALS[name]
    with joblib.parallel_config(backend="procq", n_jobs=2):
        with pytest.raises(JobFailed, match=rf"killed by {name} \(signal {int(signum)}\)") as caught:
            Parallel(batch_size=1)(delayed(jobs_joblib.crash_at)(i, 5, signum) for i in range(10))
        assert caught.value.failure.kind == "crashed"
        assert caught.value.failure.signal == name
        assert caught.value.failure.exitcode == -signum
        assert Parallel()(delayed(jobs_joblib.crash_at)(i, -1, signum) for i in range(10)) == list(range(10))


def test_a_managed_backend_keeps_working_after_a_crash() -> None:
    """``with Parallel(...) as p``: joblib keeps the backend between calls; the
    crash fails the first call and the same backend runs the next."""
    with Parallel(n_jobs=2, backend="procq", batch_size=1) as p:
        backend = p._backend
        with pytest.raises(JobFailed, match="SIGSEGV"):
            p(delayed(jobs_joblib.crash_at)(i, 3, signal.SIGSEGV) for i in range(8))
        assert p(delayed(jobs_joblib.square_and_pid)(i) for i in range(8))[-1][0] == 49
        assert p._backend is backend
        queue = backend._queue
        wait_until(lambda: queue.keys() == [], what="every batch's key forgotten")


def test_a_tasks_own_exception_is_raised_as_itself() -> None:
    with pytest.raises(ValueError, match="item 3 is bad"):
        Parallel(n_jobs=2, backend="procq")(delayed(jobs_joblib.raise_at)(i, 3) for i in range(6))


def test_n_jobs_bounds_the_tasks_running_at_once(tmp_path: Path) -> None:
    counter = tmp_path / "running"
    with joblib.parallel_config(backend="procq", n_jobs=2):
        pids = Parallel(batch_size=1)(delayed(jobs_joblib.counted)(str(counter), 0.05) for _ in range(12))
    running, most = (int(n) for n in counter.read_text().split())
    assert running == 0
    assert 1 <= most <= 2
    assert len(set(pids)) <= 2


def test_n_jobs_maps_to_workers() -> None:
    backend = ProcqBackend()
    assert backend.effective_n_jobs(3) == 3
    assert backend.effective_n_jobs(-1) == os.cpu_count()
    assert backend.effective_n_jobs(-(os.cpu_count() or 1) - 5) == 1
    with pytest.raises(ValueError, match="n_jobs == 0"):
        backend.effective_n_jobs(0)


def test_n_jobs_1_runs_in_this_process_as_joblib_does_for_every_backend() -> None:
    out = Parallel(n_jobs=1, backend="procq")(delayed(jobs_joblib.square_and_pid)(i) for i in range(3))
    assert out == [(0, os.getpid()), (1, os.getpid()), (4, os.getpid())]


def test_nested_parallel_uses_threads_inside_a_worker() -> None:
    out = Parallel(n_jobs=2, backend="procq")(delayed(jobs_joblib.nested)(i) for i in range(2))
    for backend_name, inner in out:
        assert backend_name == "ThreadingBackend"
        assert [j for j, _, _ in inner] == [0, 1, 2, 3]
        assert len({pid for _, pid, _ in inner}) == 1  # no processes below a worker
        assert os.getpid() not in {pid for _, pid, _ in inner}


def test_timeout_fails_the_batch_that_ran_too_long() -> None:
    with joblib.parallel_config(backend="procq", n_jobs=2, timeout=0.3):
        with pytest.raises(JobFailed) as caught:
            Parallel(batch_size=1)(delayed(jobs_joblib.nap)(s) for s in (0.0, 30.0))
        assert caught.value.failure.kind == "timeout"


def test_options_are_checked_when_configured() -> None:
    with pytest.raises(ValueError), joblib.parallel_config(backend="procq", memory_limit="lots"):
        pass
    with pytest.raises(TypeError), joblib.parallel_config(backend="procq", retry=3):
        pass
    with pytest.raises(TypeError), joblib.parallel_config(backend="procq", no_such_option=1):
        pass
    with joblib.parallel_config(backend="procq", n_jobs=2, retry=Retry(attempts=2), memory_limit="1G"):
        assert Parallel()(delayed(abs)(-i) for i in range(5)) == list(range(5))


def test_importing_registers_the_backend_by_name() -> None:
    assert procq.joblib.NAME == "procq"
    with joblib.parallel_config(backend="procq") as config:
        assert isinstance(config["backend"], ProcqBackend)


def test_scikit_learn_cross_val_score_in_procq_workers() -> None:
    try:
        from sklearn.datasets import make_classification
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import cross_val_score
    except ImportError:
        if os.environ.get("CI") == "true":  # the test extra brings scikit-learn
            raise
        pytest.skip("scikit-learn is not installed (pip install -e '.[test]')")
    X, y = make_classification(n_samples=200, n_features=8, random_state=0)
    model = LogisticRegression(max_iter=500)
    expected = cross_val_score(model, X, y, cv=4, n_jobs=1)
    with joblib.parallel_config(backend="procq"):
        got = cross_val_score(model, X, y, cv=4, n_jobs=2)
    assert list(got) == list(expected)


@pytest.mark.parametrize("name", ["KeyboardInterrupt", "SystemExit"])
def test_a_tasks_base_exception_is_raised_as_itself(name: str) -> None:
    expected = {"KeyboardInterrupt": KeyboardInterrupt, "SystemExit": SystemExit}[name]
    with pytest.raises(expected):
        Parallel(n_jobs=2, backend="procq")(delayed(jobs_joblib.raise_base)(name) for _ in range(2))
    assert Parallel(n_jobs=2, backend="procq")(delayed(abs)(-i) for i in range(3)) == [0, 1, 2]


def test_inside_a_daemonic_process_it_runs_sequentially_with_a_warning() -> None:
    """A multiprocessing.Pool worker may not have children: one job, with the
    UserWarning joblib's own process backends give there."""
    with multiprocessing.get_context("forkserver").Pool(1) as pool:
        out, caught = pool.apply(jobs_joblib.procq_parallel_here)
    assert out == [0, 1, 2, 3]
    assert len(caught) == 1
    assert re.match(r"UserWarning: procq-backed parallel loops cannot be called in a daemonic process", caught[0])


def test_inside_a_loky_worker_it_falls_back_with_a_warning_that_names_the_cause() -> None:
    """loky names its start method "loky" in its workers, and every process
    started there would die setting it: procq runs one job and says why
    (not that the main module needs a guard)."""
    ((out, caught),) = Parallel(n_jobs=2, backend="loky")(delayed(jobs_joblib.procq_parallel_here)() for _ in range(1))
    assert out == [0, 1, 2, 3]
    assert len(caught) == 1
    assert "multiprocessing start method is 'loky'" in caught[0] and "__main__" not in caught[0]
    # A ProcQueue opened there directly says so too, at once.
    (said,) = Parallel(n_jobs=2, backend="loky")(delayed(jobs_joblib.open_a_queue_here)() for _ in range(1))
    assert re.match(r"this process's multiprocessing start method is 'loky', which the standard library", said)
    from joblib.externals.loky import get_reusable_executor

    get_reusable_executor().shutdown(wait=True, kill_workers=True)


def test_initializer_runs_in_each_worker_from_parallel_and_from_parallel_config() -> None:
    out = Parallel(n_jobs=2, backend="procq", batch_size=1, initializer=jobs_joblib.remember_init, initargs=("p",))(
        delayed(jobs_joblib.init_seen)(i) for i in range(8)
    )
    assert all(seen == ["p"] for _, seen in out)  # once per worker, before its first batch
    with joblib.parallel_config(backend="procq", n_jobs=2, initializer=jobs_joblib.remember_init, initargs=("c",)):
        out = Parallel(batch_size=1)(delayed(jobs_joblib.init_seen)(i) for i in range(8))
    assert all(seen == ["c"] for _, seen in out)
    assert os.getpid() not in {pid for pid, _ in out}
    with pytest.raises(TypeError, match="initializer must be a callable"):
        Parallel(n_jobs=2, backend="procq", initializer=3)(delayed(abs)(i) for i in range(2))


def test_a_memmap_written_in_workers_by_filename(tmp_path: Path) -> None:
    """joblib memory-maps large arrays only for loky and multiprocessing; under
    procq an ``np.memmap`` argument arrives as a copy, so workers write into
    the file by opening it themselves (docs/ecosystem.md)."""
    np = pytest.importorskip("numpy")
    path = str(tmp_path / "out.mmap")
    array = np.memmap(path, dtype="float64", mode="w+", shape=(4,))
    Parallel(n_jobs=2, backend="procq")(delayed(jobs_joblib.write_into_memmap)(path, i) for i in range(4))
    assert list(np.memmap(path, dtype="float64", mode="r", shape=(4,))) == [0.0, 10.0, 20.0, 30.0]
    del array


def _pids_of_calls(n_jobs: int, calls: int) -> list[set[int]]:
    return [
        set(Parallel(n_jobs=n_jobs, backend="procq", batch_size=1)(delayed(jobs_joblib.pid)(i) for i in range(20)))
        for _ in range(calls)
    ]


def test_parallel_calls_with_the_same_settings_reuse_the_workers() -> None:
    """As loky's reusable executor: the workers outlive a call, and the next
    call with the same settings runs on them; other settings replace them."""
    first, second, third = _pids_of_calls(2, 3)
    assert len(first | second | third) <= 2  # fresh workers per call would make up to 6
    (other,) = _pids_of_calls(3, 1)
    assert not other & first  # another worker count: new workers
    assert len(other) <= 3


def test_a_call_that_sends_no_batch_starts_no_worker() -> None:
    procq.joblib.shutdown()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    assert Parallel(n_jobs=2, backend="procq")(delayed(jobs_joblib.pid)(i) for i in []) == []
    assert procq.joblib._SHARED._queue is None
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_the_shared_workers_stop_at_shutdown_and_the_next_call_starts_others() -> None:
    (first,) = _pids_of_calls(2, 1)
    procq.joblib.shutdown()
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in first)
    (after,) = _pids_of_calls(2, 1)
    assert not after & first


def test_a_task_that_cannot_be_pickled_after_the_first_batches_fails_the_call_at_once() -> None:
    """The first batches are dispatched from the caller's thread, the later
    ones from the backend's callback thread: a pickling error there fails the
    call as it does here (it hung, once)."""
    assert Parallel(n_jobs=2, backend="procq", batch_size=1)(delayed(abs)(i) for i in range(4)) == list(range(4))
    started = time.monotonic()
    with pytest.raises(pickle.PicklingError, match=r"cannot pickle '_thread\.lock' object"):
        Parallel(n_jobs=2, backend="procq", batch_size=1)(delayed(abs)(a) for a in [*range(10), threading.Lock()])
    assert time.monotonic() - started < 1.0
    # The first batch alone: raised in the caller's thread, the same type.
    with pytest.raises(pickle.PicklingError):
        Parallel(n_jobs=2, backend="procq", batch_size=1)(delayed(abs)(a) for a in [threading.Lock()])
    assert Parallel(n_jobs=2, backend="procq")(delayed(abs)(i) for i in range(4)) == list(range(4))


def test_an_exception_that_cannot_come_back_is_a_broken_process_pool_with_its_text() -> None:
    with pytest.raises(BrokenProcessPool, match="item 3 holds a lock") as caught:
        Parallel(n_jobs=2, backend="procq", batch_size=1)(
            delayed(jobs_joblib.raise_unpicklable_at)(i, 3) for i in range(6)
        )
    assert isinstance(caught.value, procq.joblib.UnpicklableTaskError)
    assert isinstance(caught.value, JobFailed) and caught.value.failure.exc_type == "HoldsALock"
    assert Parallel(n_jobs=2, backend="procq")(delayed(abs)(i) for i in range(4)) == list(range(4))


NUMPY_FIRST = """
import json
import numpy  # at the top: the forkserver imports it with this script, before any worker
import threadpoolctl
from joblib import Parallel, delayed
import procq.joblib


def blas_threads(_):
    numpy.dot(numpy.ones((100, 100)), numpy.ones((100, 100)))
    return [info["num_threads"] for info in threadpoolctl.threadpool_info() if info["user_api"] == "blas"]


if __name__ == "__main__":
    here = [info["num_threads"] for info in threadpoolctl.threadpool_info() if info["user_api"] == "blas"]
    there = Parallel(n_jobs=2, backend="procq", batch_size=1)(delayed(blas_threads)(i) for i in range(6))
    print(json.dumps({"here": here, "there": there}))
"""


def test_thread_limits_bind_in_workers_that_started_with_numpy_loaded(tmp_path: Path) -> None:
    """numpy imported at the script's top is loaded in the forkserver, its
    BLAS pool sized there; each worker's pool is still set to the limit
    (``cpu_count() // n_jobs``), as threadpoolctl reports in the worker."""
    script = tmp_path / "numpy_first.py"
    script.write_text(NUMPY_FIRST)
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_NUM_THREADS", "_MAXIMUM_THREADS"))}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    expected = max((os.cpu_count() or 1) // 2, 1)
    assert seen["here"] and all(n >= expected for n in seen["here"])
    assert all(threads and set(threads) == {expected} for threads in seen["there"]), seen
