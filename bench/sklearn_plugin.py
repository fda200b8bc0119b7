"""A pytest plugin for ``bench.sklearn_tests``: runs scikit-learn's own tests
with joblib's default backend set to ``$PROCQ_BENCH_BACKEND`` (``procq`` or
``loky``), keeping only those whose code or parameters name ``n_jobs``.

Loaded with ``-p bench.sklearn_plugin``. Nothing is preloaded in the
forkserver: procq starts from pytest, as a user's test run does.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import pytest

_CONTEXT: Any = None


def pytest_configure(config: pytest.Config) -> None:
    global _CONTEXT
    import joblib

    backend = os.environ.get("PROCQ_BENCH_BACKEND", "loky")
    if backend == "procq":
        import procq.joblib  # noqa: F401  (registers the backend)
    _CONTEXT = joblib.parallel_config(backend=backend)
    _CONTEXT.__enter__()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _CONTEXT is not None:
        _CONTEXT.__exit__(None, None, None)


def _uses_n_jobs(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "n_jobs" in callspec.params:
        return True
    try:
        return "n_jobs" in inspect.getsource(item.function)  # type: ignore[attr-defined]
    except (OSError, TypeError, AttributeError):
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep = [item for item in items if _uses_n_jobs(item)]
    drop = [item for item in items if not _uses_n_jobs(item)]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
