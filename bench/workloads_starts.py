"""Workloads of worker starts: the crash batch with its job in a main script
(``crash_main``), and a fresh engine's first job (``start``).

``crash_main``: ``workloads.crash_batch`` run by ``bench/crash_main.py``, a
main script of about 1,900 lines, as a program of its own, with the job
defined in it and each engine opened with its own default start method. What
``python -m bench`` hides otherwise: its own main module is a package's
``__main__`` that no worker imports, and its jobs live in a small module
that the forkserver preloads; most programs keep their jobs in the script
they run, which an engine's workers may import again at every start. Each
run is a fresh process (not timed); the figures are taken inside it, as in
``crash``.

``start``: open the engine, then time from the first submit to the moment
its job starts running in a worker (the job returns ``time.monotonic()``,
one clock for every process on Linux): what a new worker costs the first
job that waits for it, once the engine's constructor has returned. The
median of ``start_samples`` engines, each opened and closed in turn.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

from bench import jobs
from bench.arrays import ARRAYS
from bench.engines import Peer
from bench.workloads import WORKLOADS, Config, Metric, Workload, num

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "crash_main.py")
HEAVY_SCRIPT = os.path.join(ROOT, "bench", "crash_heavy.py")


def run_crash_main(peer: Peer, cfg: Config, tmp: str) -> dict[str, float]:
    return _run_script(SCRIPT, peer, cfg, tmp)


def run_crash_heavy(peer: Peer, cfg: Config, tmp: str) -> dict[str, float]:
    return _run_script(HEAVY_SCRIPT, peer, cfg, tmp, "lazy")


def run_crash_heavy_top(peer: Peer, cfg: Config, tmp: str) -> dict[str, float]:
    return _run_script(HEAVY_SCRIPT, peer, cfg, tmp, "top")


def _run_script(script: str, peer: Peer, cfg: Config, tmp: str, *more: str) -> dict[str, float]:
    """Run a program of the crash batch as a process of its own; its figures."""
    config = json.dumps(dataclasses.asdict(cfg))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, script, peer.name, config, tmp, *more],
        capture_output=True,
        text=True,
        env=env,
        timeout=cfg.crash_timeout + 120,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{peer.name}: {script} exited with {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    figures: dict[str, float] = json.loads(proc.stdout.splitlines()[-1])
    return figures


def run_start(peer: Peer, cfg: Config, tmp: str) -> dict[str, float]:
    samples: list[float] = []
    for _ in range(cfg.start_samples):
        e = peer.open(cfg.workers)
        try:
            pushed = time.monotonic()
            running = e.result(e.submit(jobs.now), 60.0)
            samples.append(running - pushed)
        except BaseException:
            e.abort()
            raise
        e.close()
    return {"start_ms": statistics.median(samples) * 1e3}


CRASH_MAIN = Workload(
    "crash_main",
    "every 10th job SIGKILLs its worker; the job in a 1,900-line main script, default start methods",
    run_crash_main,
    (
        Metric("good_ok", "good jobs correct (of {good})", "higher", num("{:.0f}"), ratio=False),
        Metric("crash_hung", "crashed jobs never resolved (of {crashes})", "lower", num("{:.0f}"), ratio=False),
        Metric("recover_ms", "last crash -> last answer, ms", "lower", num("{:,.0f}")),
        Metric("batch_ms", "first push -> last answer, ms", "lower", num("{:,.0f}")),
    ),
)

_CRASH_METRICS = (
    Metric("good_ok", "good jobs correct (of {good})", "higher", num("{:.0f}"), ratio=False),
    Metric("crash_hung", "crashed jobs never resolved (of {crashes})", "lower", num("{:.0f}"), ratio=False),
    Metric("batch_ms", "first push -> last answer, ms", "lower", num("{:,.0f}")),
)
_HEAVY_NOTE = (
    "the job's module imports numpy and scipy (about 0.4 s per import); every worker ran it once before the "
    "batch; procq alone: the peers' workers each import it again (seconds per batch)",
)

CRASH_HEAVY = Workload(
    "crash_heavy",
    "every 10th job SIGKILLs its worker; the job module (numpy, scipy) imported under the main guard",
    run_crash_heavy,
    _CRASH_METRICS,
    engines=("procq",),
    notes=_HEAVY_NOTE,
)

CRASH_HEAVY_TOP = Workload(
    "crash_heavy_top",
    "the same, the job module imported at the script's top (so by the forkserver)",
    run_crash_heavy_top,
    _CRASH_METRICS,
    engines=("procq",),
    notes=_HEAVY_NOTE,
)

START = Workload(
    "start",
    "a fresh engine's first job: submit -> job running",
    run_start,
    (Metric("start_ms", "submit -> job running, median ms", "lower", num("{:,.2f}")),),
)


def every_workload() -> dict[str, Workload]:
    """``workloads.WORKLOADS`` with these, each after its kin."""
    merged: dict[str, Workload] = {}
    for name, workload in WORKLOADS.items():
        merged[name] = workload
        if name == "crash":
            merged[CRASH_MAIN.name] = CRASH_MAIN
            merged[CRASH_HEAVY.name] = CRASH_HEAVY
            merged[CRASH_HEAVY_TOP.name] = CRASH_HEAVY_TOP
        elif name == "startup":
            merged[START.name] = START
        elif name == "bigdata":
            merged[ARRAYS.name] = ARRAYS
    return merged
