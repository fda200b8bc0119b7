"""A known workload for the metrics tests, and what it must have counted."""

from __future__ import annotations

import importlib
import os
from typing import Any

import jobs
import pytest
from core_support import WAIT, Gates, hold, wait_until

from procq import Cached, InFlight, Job, JobFailed, ProcQueue


def require(module: str, extra: str) -> Any:
    """``module``, or the calling test module skipped when it is missing
    (failed under CI, which installs procq[prometheus,otel,top]: there it is a broken install)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"{module} is not installed (pip install 'procq[{extra}]')", allow_module_level=True)


#: What ``run_workload`` leaves counted in lane "cpu".
EXPECTED = {
    "pushed": 6,  # k1, k2, k3, held, crash, slow
    "joined": 1,
    "cached": 1,
    "started": 6,
    "completed": 4,
    "failed": {"crashed": 1, "timeout": 1},
    "deaths": {"crashed:SIGSEGV": 1, "timeout": 1},
    "worker_starts": 4,  # two, and one replacement per death
}


def run_workload(q: ProcQueue, gates: Gates) -> None:
    """In lane "cpu": three completions, a cached answer, a join, a crash and a timeout."""
    for i in (1, 2, 3):
        assert q.push_and_wait(Job(f"k{i}", jobs.square, args=(i,), lane="cpu"), timeout=WAIT) == i * i
    assert q.push(Job("k1", jobs.square, args=(1,), lane="cpu")) == Cached(1)
    handle, _, gate = hold(q, gates, "held", lane="cpu")
    joined = q.push(Job("held", jobs.signal_and_wait, args=(gate.started, gate.go), lane="cpu"))
    assert isinstance(joined, InFlight)
    gate.open()
    handle.result(timeout=WAIT)
    with pytest.raises(JobFailed, match="crashed"):
        q.push_and_wait(Job("crash", jobs.segfault, lane="cpu"), timeout=WAIT)
    with pytest.raises(JobFailed, match="timeout"):
        q.push_and_wait(Job("slow", jobs.block_forever, lane="cpu", timeout=0.3), timeout=WAIT)
    wait_until(lambda: q.metrics().lanes["cpu"].worker_starts == EXPECTED["worker_starts"], what="replacements")
