"""joblib's own ``test_parallel.py``, run with procq added where it lists process backends.

joblib ships its tests inside the package (``joblib.test.test_parallel``).
This module imports that module once ``procq.joblib`` has registered the
``"procq"`` backend (so joblib's lists built from its backend registry hold
it), then, in every ``parametrize`` over backends that lists a process
backend (``"loky"`` or ``"multiprocessing"``), adds procq: after the value
``"loky"`` the value ``"procq"`` (and a ``ProcqBackend()`` where the list holds
backend instances); in rows of several values, a copy of each row with
``"loky"`` replaced by ``"procq"``. Only the cases that run procq are kept
(``conftest.py`` deselects the rest: joblib's own backends are joblib's to
test), and their assertions are joblib's, unchanged.

Left out, each with its reason (``EXCLUDED``): the tests that read other
backends' private attributes, and those of memory-mapping, which joblib
scopes to its own loky and multiprocessing backends.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

try:
    import joblib  # noqa: F401
except ImportError:
    if os.environ.get("CI") == "true":  # CI installs procq[joblib]: there it is a broken install
        raise
    pytest.skip("joblib is not installed (pip install 'procq[joblib]')", allow_module_level=True)

import procq.joblib  # registers "procq" before joblib's test module reads its registry
from procq.joblib import ProcqBackend

joblib_tests = pytest.importorskip("joblib.test.test_parallel")

PROCQ = procq.joblib.NAME
PROCESS = {"loky", "multiprocessing"}

#: joblib's tests left out for procq, and why.
EXCLUDED = {
    "test_parallel_thread_limit": "needs joblib's compiled OpenMP helper (parallel_sum), which its wheel does not "
    "ship: joblib skips it for every backend",
    "test_error_capture": "reads get_workers(), loky's _workers and multiprocessing's _pool: private attributes "
    "(test_joblib.py checks that a task's KeyboardInterrupt is raised as itself)",
    "test_auto_memmap_on_arrays_from_generator": "memory-mapping, which joblib scopes to loky and multiprocessing",
    "test_memmapping_leaks": "memory-mapping, which joblib scopes to loky and multiprocessing",
    "test_parallel_with_interactively_defined_functions": "runs a script in a fresh interpreter that names the "
    "backend without importing procq.joblib, which registers it (joblib's registry is per process)",
    "test_parallel_with_unpicklable_functions_in_args": "runs a script in a fresh interpreter that names the "
    "backend without importing procq.joblib, which registers it (joblib's registry is per process)",
    "test_background_thread_parallelism": "names no backend: it runs loky, whatever the parameter",
    "test_thread_bomb_mitigation": "the RecursionError it provokes in a worker cannot be pickled there (pickling "
    "that exception object exceeds the depth limit), so it comes back as JobFailed naming RecursionError; joblib "
    "makes loky's own failure to send it an expected failure",
}


@pytest.fixture(autouse=True)
def _joblib_pools_stopped() -> Iterator[None]:
    """Stop what joblib's tests leave running for the next (procq's and loky's
    reusable workers, a Manager they drop), before the suite's leak check."""
    yield
    procq.joblib.shutdown()
    from joblib.externals.loky import reusable_executor

    executor = reusable_executor._executor
    if executor is not None:
        executor.shutdown(wait=True, kill_workers=True)
    gc.collect()  # (a dropped multiprocessing Manager stops its process when collected)


#: Rows of several arguments whose other values are expectations about loky in
#: particular; procq's rows state procq's behaviour instead (not loky's with
#: its name changed): a procq worker is an ordinary process, neither daemonic
#: nor a loky worker, so a nested multiprocessing or procq pool runs there
#: without a warning; procq falls back to one job (warning) inside a daemonic
#: multiprocessing worker and inside a loky worker, and works below threads;
#: an earlier generator's garbage collection stops nothing another call
#: uses (loky's shuts down the executor it shares).
PROCQ_ROWS: dict[str, list[tuple[Any, ...]]] = {
    "test_nested_parallel_warnings": [
        (PROCQ, "multiprocessing", False),
        (PROCQ, PROCQ, False),
        ("multiprocessing", PROCQ, True),
        ("loky", PROCQ, True),
        ("threading", PROCQ, False),
    ],
    "test_multiple_generator_call_separated_gc": [(PROCQ, False)],
}


def _with_procq(values: Any) -> list[Any] | None:
    """``values`` with procq added after loky, or None if they list no process backend."""
    values = list(values)
    if all(isinstance(v, (tuple, list)) for v in values) and values:  # rows of several arguments
        if not any(PROCESS & {x for x in row if isinstance(x, str)} for row in values):
            return None
        rows = list(values)
        for row in values:
            if "loky" in row:
                copy = tuple(PROCQ if x == "loky" else x for x in row)
                if copy not in rows:
                    rows.append(copy)
        return rows
    if not PROCESS & {v for v in values if isinstance(v, str)}:
        return None
    if PROCQ not in values:
        values.insert(values.index("loky") + 1 if "loky" in values else len(values), PROCQ)
    if any(isinstance(v, joblib_tests.ParallelBackendBase) for v in values) and not any(
        isinstance(v, ProcqBackend) for v in values
    ):
        values.append(ProcqBackend())
    return values


def _add_procq(fn: Callable[..., Any]) -> bool:
    """Add procq to ``fn``'s backend parametrizations; True if it has any."""
    marks = getattr(fn, "pytestmark", [])
    changed = False
    for i, mark in enumerate(marks):
        if mark.name != "parametrize" or "backend" not in str(mark.args[0]):
            continue
        rows = PROCQ_ROWS.get(fn.__name__)
        values = [*mark.args[1], *rows] if rows is not None else _with_procq(mark.args[1])
        if values is None:
            continue
        marks[i] = pytest.mark.parametrize(mark.args[0], values, *mark.args[2:], **mark.kwargs).mark
        changed = True
    return changed


def _collect() -> dict[str, Any]:
    """joblib's tests that list process backends, procq added, and every
    function and class they pass to workers, as this module's own: a worker
    started afresh (loky's, a nested procq's) then unpickles them from this
    module, which registers "procq" there too, as a program using
    ``procq.joblib`` does. (joblib's registry of backends is per process.)"""
    names: dict[str, Any] = {}
    for name, obj in vars(joblib_tests).items():
        if name.startswith("__") or getattr(obj, "__module__", None) != joblib_tests.__name__:
            continue
        # Left out (not collected, so not reported as skipped), for the reasons in EXCLUDED.
        if name.startswith("test_") and (name in EXCLUDED or not _add_procq(obj)):
            continue
        obj.__module__ = __name__
        names[name] = obj
    return names


globals().update(_collect())

#: joblib's own tests run under its own warnings filters (it warns, by design,
#: of cancelled tasks and nested pools), not this suite's "error".
pytestmark = pytest.mark.filterwarnings("default")


def runs_procq(params: dict[str, Any]) -> bool:
    """Whether a case of this module runs procq (for ``conftest.py``'s selection)."""
    return any(v == PROCQ or isinstance(v, ProcqBackend) for v in params.values() if isinstance(v, (str, ProcqBackend)))


# joblib's tests of thread limits in workers name loky in their bodies (and
# one reads the default backend, loky): run here with procq registered under
# that name, so that their assertions, unchanged, hold procq's workers.


@pytest.fixture
def _loky_is_procq(monkeypatch: pytest.MonkeyPatch) -> None:
    from joblib import parallel

    monkeypatch.setitem(parallel.BACKENDS, "loky", ProcqBackend)


@pytest.mark.parametrize("backend", [PROCQ])
@pytest.mark.parametrize("n_jobs", [2, 4, -2, -1])
@pytest.mark.usefixtures("_loky_is_procq")
def test_threadpool_limitation_in_child_procq(backend: str, n_jobs: int) -> None:
    joblib_tests.test_threadpool_limitation_in_child_loky(n_jobs)


@pytest.mark.parametrize("backend", [PROCQ])
@pytest.mark.parametrize("inner_max_num_threads", [1, 2, 4, None])
@pytest.mark.parametrize("n_jobs", [2, -1])
@pytest.mark.parametrize("context", [joblib_tests.parallel_config, joblib_tests.parallel_backend])
@pytest.mark.usefixtures("_loky_is_procq")
def test_threadpool_limitation_in_child_context_procq(
    backend: str, context: Any, n_jobs: int, inner_max_num_threads: int | None
) -> None:
    joblib_tests.test_threadpool_limitation_in_child_context(context, n_jobs, inner_max_num_threads)


@pytest.mark.parametrize("backend", [PROCQ])
@pytest.mark.parametrize("n_jobs", [2, -1])
@pytest.mark.parametrize("var_name", ["OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"])
@pytest.mark.parametrize("context", [joblib_tests.parallel_config, joblib_tests.parallel_backend])
@pytest.mark.usefixtures("_loky_is_procq")
def test_threadpool_limitation_in_child_override_procq(backend: str, context: Any, n_jobs: int, var_name: str) -> None:
    joblib_tests.test_threadpool_limitation_in_child_override(context, n_jobs, var_name)
