"""The benchmark's workloads, each written once for every engine.

A workload is a :class:`Workload`: a name, a ``run(peer, cfg, tmp)`` that opens
the engine, measures, closes it and returns ``{metric: value}``, the metrics it
reports (how to label and format them) and the targets it checks.
To add one, write its ``run`` and append a ``Workload`` to ``WORKLOADS``; the
runner, the table and the targets pick it up. ``engines`` limits a workload to
some engines (``cached`` is procq's alone).

Values are floats. ``math.inf`` means "never" (a waiter that was never told,
a peer that hung until the bench's own timeout). A run that raises
:class:`NotApplicable` is shown as ``n/a`` with its reason.

What is timed, and what is not:

- every engine is opened and warmed up (each worker has run a job, then
  ``warmup_jobs`` no-op round trips) before its clock starts, except in
  ``startup``, which times exactly that;
- tiny: for procq the key (``"b<n>"``) and the ``Job`` are built inside the
  clock, one per push, since they are part of what a procq user pays;
- latency: each sample is one ``submit`` and one wait for its result;
- cpu: wall time from the first submit to the last result; ideal time is the
  sum of the times the jobs measured inside their workers, over the workers;
- crash: a crashing job writes ``time.monotonic()`` (one clock for every process
  on Linux) to a file, then SIGKILLs its own worker.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from bench import jobs
from bench.engines import Engine, Peer, rss_bytes, warm

# --- configuration ------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    workers: int = 2
    warmup_jobs: int = 200
    tiny_jobs: int = 20_000
    latency_samples: int = 2_000
    latency_warmup: int = 200
    cpu_jobs: int = 32
    cpu_job_seconds: float = 0.043
    big_jobs: int = 200
    big_bytes: int = 1_000_000
    crash_jobs: int = 200
    crash_every: int = 10
    crash_timeout: float = 3.0  # for the whole batch: past it, a peer counts as hung
    crash_probes: int = 5  # sequential kills timed for the waiter's notification
    probe_timeout: float = 2.0
    cached_pushes: int = 200_000
    cached_threads: int = 8
    map_items: int = 1_000_000
    map_chunksizes: tuple[int, ...] = (100, 1_000, 10_000)
    start_samples: int = 15
    # Large arrays (bench.arrays): one array of this many MiB in (and out), a map of so many arrays of so many MiB.
    array_mib: int = 256
    array_map_items: int = 200
    array_map_mib: int = 16
    # Set by calibrate(): spin() iterations for about cpu_job_seconds.
    spin_n: int = 0

    def labels(self) -> dict[str, int]:
        """What metric labels may name: ``{good}``, ``{crashes}``, ``{threads}``."""
        crashes = self.crash_jobs // self.crash_every
        return {"good": self.crash_jobs - crashes, "crashes": crashes, "threads": self.cached_threads}


QUICK: dict[str, Any] = {
    "warmup_jobs": 30,
    "tiny_jobs": 2_000,
    "latency_samples": 300,
    "latency_warmup": 30,
    "cpu_jobs": 8,
    "cpu_job_seconds": 0.02,
    "big_jobs": 30,
    "crash_jobs": 40,
    "crash_timeout": 2.0,
    "crash_probes": 1,
    "probe_timeout": 1.0,
    "cached_pushes": 20_000,
    "map_items": 50_000,
    "map_chunksizes": (1_000,),
    "start_samples": 3,
    "array_mib": 64,
    "array_map_items": 40,
    "array_map_mib": 4,
}


def calibrate(seconds: float) -> int:
    """How many spin() iterations take about ``seconds`` here (best of 3)."""
    n = 200_000
    best = min(jobs.spin(n) for _ in range(3))
    n = max(1, int(n * seconds / best))
    best = min(jobs.spin(n) for _ in range(3))
    return max(1, int(n * seconds / best))


class NotApplicable(Exception):
    """This engine cannot run this workload; the message says why."""


@contextmanager
def opened(peer: Peer, cfg: Config, warm_jobs: int | None = None) -> Iterator[Engine]:
    engine = peer.open(cfg.workers)
    try:
        warm(engine, cfg.workers, cfg.warmup_jobs if warm_jobs is None else warm_jobs)
        yield engine
    except BaseException:
        engine.abort()
        raise
    else:
        engine.close()


# --- the workloads ----------------------------------------------------------------


def run_tiny(peer: Peer, cfg: Config, tmp: str) -> dict[str, float]:
    n = cfg.tiny_jobs
    with opened(peer, cfg) as e:
        submit, result, noop = e.submit, e.result, jobs.noop
        t0 = time.perf_counter()
        futures = [submit(noop) for _ in range(n)]
        for f in futures:
            result(f, 120.0)
        wall = time.perf_counter() - t0
    return {"jobs_per_s": n / wall}


def _percentile(sorted_values: list[int], q: float) -> int:
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def run_latency(peer: Peer, cfg: Config, tmp: str) -> dict[str, float]:
    clock = time.perf_counter_ns
    samples: list[int] = []
    with opened(peer, cfg) as e:
        submit, result, noop = e.submit, e.result, jobs.noop
        for _ in range(cfg.latency_warmup):
            result(submit(noop), 60.0)
        for _ in range(cfg.latency_samples):
            t0 = clock()
            result(submit(noop), 60.0)
            samples.append(clock() - t0)
    s = sorted(samples)
    return {"p50_us": statistics.median(s) / 1e3, "p99_us": _percentile(s, 0.99) / 1e3}


def run_cpu(peer: Peer, cfg: Config, tmp: str) -> dict[str, float]:
    with opened(peer, cfg) as e:
        t0 = time.perf_counter()
        futures = [e.submit(jobs.spin, cfg.spin_n) for _ in range(cfg.cpu_jobs)]
        durations = [e.result(f, 120.0) for f in futures]
        wall = time.perf_counter() - t0
    # Ideal wall time: all the in-job work spread perfectly over the workers.
    # The jobs' own clocks, not a calibration, so a VM's slow-downs count against no engine.
    ideal = sum(durations) / cfg.workers
    return {"efficiency": ideal / wall, "job_ms": statistics.median(durations) * 1e3}


def run_bigdata(peer: Peer, cfg: Config, tmp: str) -> dict[str, float]:
    size = cfg.big_bytes
    with opened(peer, cfg) as e:
        t0 = time.perf_counter()
        futures = [e.submit(jobs.blob, size) for _ in range(cfg.big_jobs)]
        for f in futures:
            out = e.result(f, 120.0)
            if len(out) != size:
                raise RuntimeError(f"{peer.name}: a bigdata result had {len(out)} bytes, not {size}")
            del out
        wall = time.perf_counter() - t0
    return {"mb_per_s": cfg.big_jobs * size / 1e6 / wall}


def _stamp(path: str) -> float | None:
    try:
        with open(path) as f:
            return float(f.read())
    except (OSError, ValueError):
        return None


def crash_batch(
    peer: Peer, cfg: Config, tmp: str, job: Callable[[int, str], int] = jobs.double_or_die, job_warmup: bool = False
) -> dict[str, float]:
    """``crash_jobs`` jobs at once, every ``crash_every``-th SIGKILLs its
    worker. ``job(i, path)``: ``2 * i``, or stamp ``path`` and die (as
    ``jobs.double_or_die``; ``crash_main`` gives one its main script defines).
    ``job_warmup``: before the batch, untimed, every worker runs ``job``
    (without dying) as the program's earlier work would have."""
    tag = f"{peer.name.replace(' ', '_')}-{time.monotonic_ns()}"
    paths = [
        os.path.join(tmp, f"batch-{tag}-{i}") if i % cfg.crash_every == cfg.crash_every - 1 else ""
        for i in range(cfg.crash_jobs)
    ]
    e = peer.open(cfg.workers)
    clean = False
    try:
        warm(e, cfg.workers, cfg.warmup_jobs)
        if job_warmup:  # (at once, so that each idle worker takes some)
            for f in [e.submit(job, i, "") for i in range(4 * cfg.workers)]:
                e.result(f, 60.0)
        futures: list[Any] = []
        first_push = time.monotonic()
        for i, p in enumerate(paths):
            try:
                futures.append(e.submit(job, i, p))
            except Exception as exc:  # a broken pool refuses later submits (PPE)
                futures.append(exc)
        deadline = time.monotonic() + cfg.crash_timeout
        good = [i for i, p in enumerate(paths) if not p]
        bad = [i for i, p in enumerate(paths) if p]
        good_ok = good_hung = crash_told = crash_signal = crash_hung = 0
        for i in good:
            if isinstance(futures[i], Exception):
                continue  # refused at submit: not correct
            try:
                good_ok += e.result(futures[i], max(0.0, deadline - time.monotonic())) == 2 * i
            except TimeoutError:
                good_hung += 1
            except Exception:  # any failure of a good job counts as not correct
                pass
        for i in bad:
            if isinstance(futures[i], Exception):
                continue  # refused at submit: it never ran, so never crashed
            try:
                e.result(futures[i], max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                crash_hung += 1
            except Exception as exc:  # each engine has its own type for a dead worker
                crash_told += 1
                crash_signal += e.crash_signal(exc) == "SIGKILL"
        last_any = time.monotonic()
        stamps = [s for s in map(_stamp, filter(None, paths)) if s is not None]
        # A job that never answered means the last answer never came.
        recover_ms = math.inf if good_hung or crash_hung or not stamps else (last_any - max(stamps)) * 1e3
        # The whole batch, crashed jobs included: what replacing workers costs a caller.
        batch_ms = math.inf if good_hung or crash_hung else (last_any - first_push) * 1e3
        try:
            usable = e.result(e.submit(jobs.inc, 41), cfg.probe_timeout) == 42
        except Exception:  # a broken engine raises its own type
            usable = False
        clean = usable and not good_hung and not crash_hung
    finally:
        e.close() if clean else e.abort()
    return {
        "good_ok": good_ok,
        "good_hung": good_hung,
        "crash_signal": crash_signal,
        "crash_told": crash_told,
        "crash_hung": crash_hung,
        "usable_after": float(usable),
        "recover_ms": recover_ms,
        "batch_ms": batch_ms,
    }


def _notify_probes(peer: Peer, cfg: Config, tmp: str) -> dict[str, float]:
    """Kill one worker at a time with nothing else running; time from the kill to
    its waiter being told. An engine the kill breaks is opened anew for the next
    probe (not timed); one whose waiter is never told stops the probes."""
    samples: list[float] = []
    breaks = 0
    e: Engine | None = None
    try:
        for k in range(cfg.crash_probes):
            if e is None:
                e = peer.open(cfg.workers)
                warm(e, cfg.workers, 10)
            else:
                try:  # the replacement is up and has run a job
                    warm(e, cfg.workers, 10, timeout=cfg.probe_timeout)
                except Exception:  # a broken engine raises its own type
                    breaks += 1
                    e.abort()
                    e = peer.open(cfg.workers)
                    warm(e, cfg.workers, 10)
            path = os.path.join(tmp, f"probe-{peer.name.replace(' ', '_')}-{time.monotonic_ns()}-{k}")
            future = e.submit(jobs.stamp_and_die, path)
            try:
                e.result(future, cfg.probe_timeout)
            except TimeoutError:
                samples.append(math.inf)
                break
            except Exception:  # each engine has its own type for a dead worker
                notified = time.monotonic()
                stamp = _stamp(path)
                samples.append(math.inf if stamp is None else notified - stamp)
            else:
                raise RuntimeError(f"{peer.name}: the crash job returned")
            # Broken engines (every later job fails) are found by the next warm-up.
        if e is not None and samples and samples[-1] != math.inf:
            try:
                warm(e, cfg.workers, 0, timeout=cfg.probe_timeout)
            except Exception:  # a broken engine raises its own type
                breaks += 1
    finally:
        if e is not None:
            e.abort()
    return {"notify_ms": statistics.median(samples) * 1e3, "broken_by_kill": breaks / max(1, len(samples))}


def run_crash(peer: Peer, cfg: Config, tmp: str) -> dict[str, float]:
    figures = crash_batch(peer, cfg, tmp)
    figures.update(_notify_probes(peer, cfg, tmp))
    return figures


def run_startup(peer: Peer, cfg: Config, tmp: str) -> dict[str, float]:
    t0 = time.perf_counter()
    e = peer.open(cfg.workers)
    try:
        e.result(e.submit(jobs.noop), 60.0)
        took = time.perf_counter() - t0
    finally:
        e.close()
    return {"startup_ms": took * 1e3}


def run_close(peer: Peer, cfg: Config, tmp: str) -> dict[str, float]:
    e = peer.open(cfg.workers)
    try:
        warm(e, cfg.workers, cfg.warmup_jobs)
    except BaseException:
        e.abort()
        raise
    t0 = time.perf_counter()
    e.close()
    return {"close_ms": (time.perf_counter() - t0) * 1e3}


def run_cached(peer: Peer, cfg: Config, tmp: str) -> dict[str, float]:
    """``push`` of a key that completed: no IPC, one lock. 1 thread, then N at once."""
    from procq import Cached, Job

    n = cfg.cached_pushes
    with opened(peer, cfg, warm_jobs=0) as e:
        q = e.q  # type: ignore[attr-defined]
        key = f"cached-{time.monotonic_ns()}"
        q.push_and_wait(Job(key, jobs.noop), timeout=60)
        job = Job(key, jobs.noop)
        push = q.push
        if not isinstance(push(job), Cached):
            raise RuntimeError("a completed key did not push as Cached")  # not a caller's type error
        t0 = time.perf_counter()
        for _ in range(n):
            push(job)
        single = n / (time.perf_counter() - t0)

        threads = cfg.cached_threads
        per_thread = n // threads
        start = threading.Barrier(threads + 1)

        def pusher() -> None:
            mine = Job(key, jobs.noop)
            start.wait()
            for _ in range(per_thread):
                push(mine)

        workers = [threading.Thread(target=pusher) for _ in range(threads)]
        for t in workers:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in workers:
            t.join()
        together = per_thread * threads / (time.perf_counter() - t0)
    return {"single_per_s": single, "threads_per_s": together, "scaling": together / single}


class _PeakRSS:
    """Samples this process's RSS every 5 ms on a thread; ``peak`` after ``stop``."""

    def __init__(self) -> None:
        self.peak = rss_bytes()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, rss_bytes())

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
        return self.peak


def run_map(peer: Peer, cfg: Config, tmp: str) -> dict[str, float]:
    """``map_items`` tiny items through procq's ``map``, or ``Pool.imap`` with the
    best of a few chunksizes. Peak RSS is the supervisor's (this process)."""
    n = cfg.map_items
    expected = n * (n + 1) // 2  # sum of inc(x) for x in range(n)
    if peer.name == "procq":
        from procq import ProcQueue

        if not hasattr(ProcQueue, "map"):
            raise NotApplicable("procq has no map yet")
        best_q: tuple[float, int, int, int] | None = None
        with opened(peer, cfg, warm_jobs=10) as e:
            q = e.q  # type: ignore[attr-defined]
            for chunksize in cfg.map_chunksizes:  # the same choice imap gets
                # Content keys (no key function), forgotten as the map goes (its
                # default): a second round runs everything again.
                before = rss_bytes()
                sampler = _PeakRSS()
                t0 = time.perf_counter()
                total = sum(q.map(jobs.inc, iter(range(n)), chunksize=chunksize))
                wall = time.perf_counter() - t0
                peak = sampler.stop()
                if total != expected:
                    raise RuntimeError(f"procq map summed to {total}, not {expected}")
                if best_q is None or wall < best_q[0]:
                    best_q = (wall, chunksize, before, peak)
        assert best_q is not None
        wall, chunk, before, peak = best_q
        best_chunk = float(chunk)
    else:
        best: tuple[float, int, int, int] | None = None
        with opened(peer, cfg, warm_jobs=10) as e:
            pool = e.pool  # type: ignore[attr-defined]
            for chunksize in cfg.map_chunksizes:
                before = rss_bytes()
                sampler = _PeakRSS()
                t0 = time.perf_counter()
                total = sum(pool.imap(jobs.inc, iter(range(n)), chunksize))
                wall = time.perf_counter() - t0
                peak = sampler.stop()
                if total != expected:
                    raise RuntimeError(f"imap summed to {total}, not {expected}")
                if best is None or wall < best[0]:
                    best = (wall, chunksize, before, peak)
        assert best is not None
        wall, chunk, before, peak = best
        best_chunk = float(chunk)
    if total != expected:
        raise RuntimeError(f"{peer.name} map summed to {total}, not {expected}")
    return {
        "items_per_s": n / wall,
        "peak_rss_mb": peak / 1e6,
        "rss_growth_mb": (peak - before) / 1e6,
        "chunksize": best_chunk,
    }


# --- the registry -------------------------------------------------------------------

Fmt = Callable[[float], str]


def num(pattern: str) -> Fmt:
    def fmt(v: float) -> str:
        return "never" if v == math.inf else pattern.format(v)

    return fmt


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    better: str  # "higher", "lower" or "-"
    fmt: Fmt
    ratio: bool = True  # show procq / peer (not for counts, where it means little)


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    run: Callable[[Peer, Config, str], dict[str, float]]
    metrics: tuple[Metric, ...]
    engines: tuple[str, ...] | None = None  # None: every engine
    notes: tuple[str, ...] = field(default=())


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload(
            "tiny",
            "no-op jobs pushed one by one",
            run_tiny,
            (Metric("jobs_per_s", "throughput, jobs/s", "higher", num("{:,.0f}")),),
        ),
        Workload(
            "latency",
            "sequential submit-and-wait of one no-op job",
            run_latency,
            (
                Metric("p50_us", "p50, us", "lower", num("{:,.0f}")),
                Metric("p99_us", "p99, us", "lower", num("{:,.0f}")),
            ),
        ),
        Workload(
            "cpu",
            "CPU-bound jobs on every worker",
            run_cpu,
            (
                Metric("efficiency", "efficiency (ideal/wall)", "higher", num("{:.3f}")),
                Metric("job_ms", "one job in its worker, ms", "-", num("{:.1f}")),
            ),
        ),
        Workload(
            "bigdata",
            "jobs returning 1 MB each",
            run_bigdata,
            (Metric("mb_per_s", "MB/s", "higher", num("{:,.0f}")),),
        ),
        Workload(
            "crash",
            "every 10th job SIGKILLs its worker",
            run_crash,
            (
                Metric("good_ok", "good jobs correct (of {good})", "higher", num("{:.0f}"), ratio=False),
                Metric(
                    "crash_signal", "crashes reported with SIGKILL (of {crashes})", "higher", num("{:.0f}"), ratio=False
                ),
                Metric("crash_hung", "crashed jobs never resolved (of {crashes})", "lower", num("{:.0f}"), ratio=False),
                Metric("usable_after", "usable after (1 = yes)", "higher", num("{:.0f}"), ratio=False),
                Metric("recover_ms", "last crash -> last answer, ms", "lower", num("{:,.0f}")),
                Metric("batch_ms", "first push -> last answer, ms", "lower", num("{:,.0f}")),
                Metric("notify_ms", "kill -> waiter told, median ms", "lower", num("{:.2f}")),
                Metric("broken_by_kill", "kills that broke the pool", "lower", num("{:.0%}"), ratio=False),
            ),
        ),
        Workload(
            "startup",
            "open the engine + first no-op job",
            run_startup,
            (Metric("startup_ms", "create + first job, ms", "lower", num("{:,.0f}")),),
        ),
        Workload(
            "close",
            "close() of warmed, idle workers",
            run_close,
            (Metric("close_ms", "close(), ms", "lower", num("{:,.1f}")),),
        ),
        Workload(
            "cached",
            "push of a completed key (no IPC)",
            run_cached,
            (
                Metric("single_per_s", "pushes/s, 1 thread", "higher", num("{:,.0f}")),
                Metric("threads_per_s", "pushes/s, {threads} threads together", "higher", num("{:,.0f}")),
                Metric("scaling", "{threads} threads / 1 thread", "higher", num("{:.2f}")),
            ),
            engines=("procq",),
        ),
        Workload(
            "map",
            "tiny items through map / Pool.imap",
            run_map,
            (
                Metric("items_per_s", "items/s", "higher", num("{:,.0f}")),
                Metric("peak_rss_mb", "peak RSS of the supervisor (the bench process), MB", "lower", num("{:,.0f}")),
                Metric("rss_growth_mb", "RSS growth during the map, MB", "lower", num("{:,.1f}")),
                Metric("chunksize", "best chunksize (of the same few)", "-", num("{:,.0f}")),
            ),
            engines=("procq", "mp.Pool"),
        ),
    ]
}
