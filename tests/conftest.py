"""Shared fixtures: a leak check on every test, queues per start method."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from core_support import Gates, open_queue
from pg_server import own_pg_server, pg_server, url  # noqa: F401 (fixtures: stores, a throwaway PostgreSQL server)

from procq import ProcQueue


def _helper_pids() -> set[int]:
    """Multiprocessing's own long-lived helpers (forkserver, resource tracker):
    started once per session, not leaks."""
    pids = set()
    fs = getattr(multiprocessing.forkserver, "_forkserver", None)
    pid = getattr(fs, "_forkserver_pid", None)
    if pid:
        pids.add(pid)
    rt = getattr(multiprocessing.resource_tracker, "_resource_tracker", None)
    pid = getattr(rt, "_pid", None)
    if pid:
        pids.add(pid)
    loky_tracker = sys.modules.get("joblib.externals.loky.backend.resource_tracker")  # (joblib's own, if loaded)
    pid = getattr(getattr(loky_tracker, "_resource_tracker", None), "_pid", None)
    if pid:
        pids.add(pid)
    return pids


def _descendants() -> dict[int, psutil.Process]:
    me = psutil.Process(os.getpid())
    procs = {}
    for p in me.children(recursive=True):
        procs[p.pid] = p
    return procs


@pytest.fixture(autouse=True)
def no_leaked_processes() -> Iterator[None]:
    """Fail any test that leaves a child process (alive or zombie) behind it."""
    before = set(_descendants())
    yield
    backend = sys.modules.get("procq.joblib")
    if backend is not None:  # the joblib backend keeps its workers for the next call, as loky does
        backend.shutdown()
    helpers = _helper_pids()
    leaked = [p for pid, p in _descendants().items() if pid not in before and pid not in helpers]
    if not leaked:
        return
    # A process killed a moment ago may still be on its way out: give it a bounded grace.
    # (A zombie counts as leaked too: wait_procs only reports a process gone once reaped.)
    _, alive = psutil.wait_procs(leaked, timeout=3)
    real = [p for p in alive if p.is_running()]
    for p in real:  # only our own descendants, by pid
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    if real:
        desc = []
        for p in real:
            try:
                desc.append(f"{p.pid} {p.status()} {' '.join(p.cmdline())[:120]}")
            except psutil.Error:
                desc.append(str(p.pid))
        pytest.fail("test leaked child processes:\n  " + "\n  ".join(desc))


START_METHODS = ["forkserver", "spawn"]


@pytest.fixture(params=START_METHODS)
def start_method(request: pytest.FixtureRequest) -> str:
    """Each start method procq supports on this platform."""
    method: str = request.param
    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"{method} is not available on this platform")
    return method


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "key_decides: the test pushes other work under a key that is held, to show the key alone "
        "decides; its queue fixture is made with on_mismatch='ignore' (the default raises KeyConflict)",
    )


@pytest.fixture
def queue(request: pytest.FixtureRequest) -> Iterator[ProcQueue]:
    """A two-lane queue (cpu: 2 workers, io: 1), closed and checked after the test."""
    kwargs = {"on_mismatch": "ignore"} if request.node.get_closest_marker("key_decides") else {}
    with open_queue({"cpu": 2, "io": 1}, **kwargs) as q:
        yield q


@pytest.fixture
def gates(tmp_path: Path) -> Iterator[Gates]:
    """FIFO gates that hold jobs until the test opens them (closed after the test)."""
    g = Gates(tmp_path)
    try:
        yield g
    finally:
        g.close()


@pytest.fixture
def log(tmp_path: Path) -> str:
    """A file the jobs of tests/jobs_core.py append "<tag> <pid>" lines to."""
    return str(tmp_path / "log")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In test_joblib_suite.py (joblib's own tests with procq added), keep only
    the cases that run procq: joblib's own backends are joblib's to test."""
    keep, drop = [], []
    for item in items:
        module = getattr(item, "module", None)
        runs_procq = getattr(module, "runs_procq", None)
        if runs_procq is None or module.__name__ != "test_joblib_suite":
            keep.append(item)
            continue
        callspec = getattr(item, "callspec", None)
        (keep if callspec is not None and runs_procq(callspec.params) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
