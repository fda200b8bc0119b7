"""The benchmark's workloads, each written once for procq and once for
``concurrent.futures.ProcessPoolExecutor`` (PPE).

Every runner opens its own engine with ``Config.workers`` workers and the
forkserver start method, warms it up (every worker has run a job, the job
module is imported everywhere), measures, and closes it. Runners return a dict
of metric name -> value; ``bench.__main__`` interleaves them over rounds and
takes medians.

The job functions live at the top of this module, so that workers of both
engines import them by reference (this module is small and imports nothing
heavy).

What is timed, and what is not:

- tiny: the keys (``"tiny-0"``, ...) are built before the clock starts; the
  ``Job`` objects are built inside it, since they are part of what a procq user
  pays per push. PPE's ``submit`` takes the function directly.
- latency: each sample is one ``push_and_wait`` (a fresh key, ``Job`` built
  inside the sample) vs one ``submit(...).result()``.
- cpu: wall time from the first push/submit to the last result.
- crash: the job writes ``time.monotonic()`` (CLOCK_MONOTONIC, one clock for
  every process on Linux) to a file, then SIGKILLs its own worker; the waiter
  takes ``time.monotonic()`` the moment ``result()`` raises. The difference is
  the time from the kill to the waiter being notified.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

START_METHOD = "forkserver"


# --- job functions (run in the workers) -------------------------------------------


def noop() -> None:
    return None


def nap(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def spin(n: int) -> float:
    """Pure-Python CPU work; returns how long it ran, measured in the worker."""
    t0 = time.perf_counter()
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFFFFFF
    return time.perf_counter() - t0


def stamp_and_die(path: str) -> None:
    """Write the time to ``path``, then SIGKILL this worker."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    stamp = time.monotonic()
    os.write(fd, repr(stamp).encode())
    os.kill(os.getpid(), signal.SIGKILL)


# --- configuration ------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    workers: int = 2
    tiny_jobs: int = 20_000
    latency_samples: int = 2_000
    latency_warmup: int = 200
    cpu_jobs: int = 32
    cpu_job_seconds: float = 0.040
    crashes: int = 20
    warmup_jobs: int = 200
    # Set by calibrate(): spin() iterations for about cpu_job_seconds.
    spin_n: int = 0


QUICK = dict(tiny_jobs=2_000, latency_samples=300, latency_warmup=50, crashes=3, warmup_jobs=50)


def calibrate(seconds: float) -> int:
    """How many spin() iterations take about ``seconds`` here (best of 3)."""
    n = 200_000
    best = min(spin(n) for _ in range(3))
    n = max(1, int(n * seconds / best))
    best = min(spin(n) for _ in range(3))
    return max(1, int(n * seconds / best))


# --- engines, opened and warmed up ---------------------------------------------------

_key_ids = iter(range(1, 1 << 62))


def fresh_keys(prefix: str, n: int) -> list[str]:
    """``n`` keys never used before in this process."""
    return [f"{prefix}-{next(_key_ids)}" for _ in range(n)]


def _context() -> Any:
    return multiprocessing.get_context(START_METHOD)


def _every_worker(naps: Callable[[float], set[int]], cfg: Config, engine: str) -> None:
    """Run naps, one per worker at once, until every worker has run one: each
    has then started and imported this module. (A worker that is slow to start
    can let another take both naps, so a round may not reach all of them.)"""
    seen: set[int] = set()
    seconds = 0.02
    for _ in range(8):
        seen |= naps(seconds)
        if len(seen) >= cfg.workers:
            return
        seconds *= 2
    raise RuntimeError(f"warm-up reached {len(seen)} of {cfg.workers} {engine} workers")


def _warm_procq(q: Any, cfg: Config, jobs: int) -> None:
    from procq import Job

    def naps(seconds: float) -> set[int]:
        keys = fresh_keys("warm-nap", cfg.workers)
        handles = [q.push(Job(k, nap, args=(seconds,))).handle for k in keys]
        return {h.result(timeout=60) for h in handles}

    _every_worker(naps, cfg, "procq")
    for key in fresh_keys("warm", jobs):
        q.push_and_wait(Job(key, noop), timeout=60)


def _warm_ppe(ex: ProcessPoolExecutor, cfg: Config, jobs: int) -> None:
    def naps(seconds: float) -> set[int]:
        futures = [ex.submit(nap, seconds) for _ in range(cfg.workers)]
        return {f.result(timeout=60) for f in futures}

    _every_worker(naps, cfg, "PPE")
    for _ in range(jobs):
        ex.submit(noop).result(timeout=60)


@contextmanager
def procq_queue(cfg: Config, warm_jobs: int | None = None) -> Iterator[Any]:
    from procq import ProcQueue

    with ProcQueue(lanes=cfg.workers, start_method=START_METHOD) as q:
        _warm_procq(q, cfg, cfg.warmup_jobs if warm_jobs is None else warm_jobs)
        yield q


@contextmanager
def ppe_pool(cfg: Config, warm_jobs: int | None = None) -> Iterator[ProcessPoolExecutor]:
    ex = ProcessPoolExecutor(max_workers=cfg.workers, mp_context=_context())
    try:
        _warm_ppe(ex, cfg, cfg.warmup_jobs if warm_jobs is None else warm_jobs)
        yield ex
    finally:
        ex.shutdown(wait=True)


# --- 1. tiny: throughput of no-op jobs pushed one by one -------------------------------


def procq_tiny(cfg: Config, tmp: str) -> dict[str, float]:
    from procq import Job

    keys = fresh_keys("tiny", cfg.tiny_jobs)
    with procq_queue(cfg) as q:
        push = q.push
        t0 = time.perf_counter()
        handles = [push(Job(key, noop)).handle for key in keys]
        for h in handles:
            h.result(timeout=120)
        wall = time.perf_counter() - t0
    return {"jobs_per_s": cfg.tiny_jobs / wall}


def ppe_tiny(cfg: Config, tmp: str) -> dict[str, float]:
    with ppe_pool(cfg) as ex:
        submit = ex.submit
        t0 = time.perf_counter()
        futures = [submit(noop) for _ in range(cfg.tiny_jobs)]
        for f in futures:
            f.result(timeout=120)
        wall = time.perf_counter() - t0
    return {"jobs_per_s": cfg.tiny_jobs / wall}


# --- 2. latency: one no-op job at a time, round trip -------------------------------------


def _percentiles(samples_ns: list[int]) -> dict[str, float]:
    s = sorted(samples_ns)
    p99 = s[max(0, math.ceil(0.99 * len(s)) - 1)]
    return {"p50_us": statistics.median(s) / 1e3, "p99_us": p99 / 1e3}


def procq_latency(cfg: Config, tmp: str) -> dict[str, float]:
    from procq import Job

    keys = fresh_keys("lat", cfg.latency_warmup + cfg.latency_samples)
    clock = time.perf_counter_ns
    samples: list[int] = []
    with procq_queue(cfg) as q:
        pw = q.push_and_wait
        for key in keys[: cfg.latency_warmup]:
            pw(Job(key, noop), timeout=60)
        for key in keys[cfg.latency_warmup :]:
            t0 = clock()
            pw(Job(key, noop), timeout=60)
            samples.append(clock() - t0)
    return _percentiles(samples)


def ppe_latency(cfg: Config, tmp: str) -> dict[str, float]:
    clock = time.perf_counter_ns
    samples: list[int] = []
    with ppe_pool(cfg) as ex:
        submit = ex.submit
        for _ in range(cfg.latency_warmup):
            submit(noop).result(timeout=60)
        for _ in range(cfg.latency_samples):
            t0 = clock()
            submit(noop).result(timeout=60)
            samples.append(clock() - t0)
    return _percentiles(samples)


# --- 3. cpu: CPU-bound jobs on every worker ------------------------------------------------


def _efficiency(cfg: Config, durations: list[float], wall: float) -> dict[str, float]:
    # Ideal wall time: all the in-job work spread perfectly over the workers.
    ideal = sum(durations) / cfg.workers
    return {
        "efficiency": ideal / wall,
        "wall_s": wall,
        "job_ms": statistics.median(durations) * 1e3,
    }


def procq_cpu(cfg: Config, tmp: str) -> dict[str, float]:
    from procq import Job

    keys = fresh_keys("cpu", cfg.cpu_jobs)
    with procq_queue(cfg) as q:
        t0 = time.perf_counter()
        handles = [q.push(Job(key, spin, args=(cfg.spin_n,))).handle for key in keys]
        durations = [h.result(timeout=120) for h in handles]
        wall = time.perf_counter() - t0
    return _efficiency(cfg, durations, wall)


def ppe_cpu(cfg: Config, tmp: str) -> dict[str, float]:
    with ppe_pool(cfg) as ex:
        t0 = time.perf_counter()
        futures = [ex.submit(spin, cfg.spin_n) for _ in range(cfg.cpu_jobs)]
        durations = [f.result(timeout=120) for f in futures]
        wall = time.perf_counter() - t0
    return _efficiency(cfg, durations, wall)


# --- 4. crash: from a worker's SIGKILL to its waiter being told --------------------------


def _read_stamp(path: str) -> float:
    with open(path) as f:
        return float(f.read())


def _full_strength(q: Any, cfg: Config, restarts: int) -> None:
    """Wait until the lane has replaced every killed worker, then warm the
    replacement, so the next crash starts from the same state as the first.

    ``workers_alive`` counts a replacement that is still starting, so it is
    at full size right after the crash. It is the warm-up (a nap run on
    ``cfg.workers`` different pids, which the dead one cannot be) that proves
    the replacement has started and taken a job."""
    deadline = time.monotonic() + 60
    while True:
        lane = next(iter(q.stats().lanes.values()))
        if lane.worker_restarts >= restarts and lane.workers_alive == cfg.workers:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"procq lane did not recover after crash {restarts}: {lane}")
        time.sleep(0.002)  # a benchmark's bounded poll, not synchronisation in a test
    _warm_procq(q, cfg, jobs=10)


def procq_crash(cfg: Config, tmp: str) -> dict[str, float]:
    from procq import Job, JobFailed

    samples: list[float] = []
    with procq_queue(cfg) as q:
        for i, key in enumerate(fresh_keys("crash", cfg.crashes)):
            path = os.path.join(tmp, key)
            handle = q.push(Job(key, stamp_and_die, args=(path,))).handle
            try:
                handle.result(timeout=60)
            except JobFailed as exc:
                notified = time.monotonic()
                if exc.failure.kind != "crashed":
                    raise
            else:
                raise RuntimeError("the crash job returned")
            samples.append(notified - _read_stamp(path))
            _full_strength(q, cfg, restarts=i + 1)
        lane = next(iter(q.stats().lanes.values()))
        assert lane.crashes == cfg.crashes, lane
    return {"notify_ms": statistics.median(samples) * 1e3, "pool_broken": 0.0}


def ppe_crash(cfg: Config, tmp: str) -> dict[str, float]:
    samples: list[float] = []
    broken = 0
    for i, key in enumerate(fresh_keys("ppe-crash", cfg.crashes)):
        path = os.path.join(tmp, key)
        # A killed worker breaks the whole pool: every crash needs a new one.
        with ppe_pool(cfg, warm_jobs=10) as ex:
            future = ex.submit(stamp_and_die, path)
            try:
                future.result(timeout=60)
            except BrokenProcessPool:
                notified = time.monotonic()
            else:
                raise RuntimeError("the crash job returned")
            samples.append(notified - _read_stamp(path))
            try:
                ex.submit(noop)
            except BrokenProcessPool:
                broken += 1
    return {"notify_ms": statistics.median(samples) * 1e3, "pool_broken": broken / cfg.crashes}


Runner = Callable[[Config, str], "dict[str, float]"]

#: name -> (procq runner, PPE runner), in the order they run in a round.
WORKLOADS: dict[str, tuple[Runner, Runner]] = {
    "tiny": (procq_tiny, ppe_tiny),
    "latency": (procq_latency, ppe_latency),
    "cpu": (procq_cpu, ppe_cpu),
    "crash": (procq_crash, ppe_crash),
}
