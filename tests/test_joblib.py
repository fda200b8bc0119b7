"""The joblib backend (``procq.joblib``) driven by joblib itself: results as
the sequential backend's, a crashing batch failing the call with the signal
named while the next call works, ``n_jobs`` as a bound on concurrency, nested
calls, the options, and a scikit-learn workload when scikit-learn is installed.
The autouse leak check (conftest) holds every test to leaving no worker behind.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import re
import signal
from pathlib import Path

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
