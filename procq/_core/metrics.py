"""What a queue counts as it runs, and the one snapshot of it that every reader takes.

The counters are plain integers kept where the state they follow already
changes, under the lock already held there (``Core.lock``): a lane's
``Tally`` is bumped by the state map (claims, starts, ends), by ``Dispatch``
(worker starts and deaths) and, for a store, by its commits. Nothing is
computed until somebody reads: ``metrics(core)`` copies the counters under
the lock (a few dict and list copies, no I/O), then, with no lock held,
reads the workers' memory and CPU time from the kernel and builds the frozen
``QueueMetrics`` that the exporters (``procq.metrics.prometheus``,
``procq.metrics.otel``) and the monitor's socket (``_api.monitor``) serve.

Histograms have fixed buckets (Prometheus' cumulative ``le`` bounds, the
last one +Inf): an observation is one ``bisect`` and two additions.

A completed key answered without the lock (``Core.claim``'s fast path) is
counted in an ``itertools.count``: ``next()`` on it is one C call, atomic
under the GIL, where ``+= 1`` on a shared int from many threads could lose
counts.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procq._core.core import Core
    from procq._model.values import QueueStats

__all__ = [
    "COMMIT_BUCKETS",
    "JOB_BUCKETS",
    "RECENT_FAILURES",
    "Histogram",
    "HistogramSnapshot",
    "LaneMetrics",
    "QueueMetrics",
    "RecentFailure",
    "StoreMetrics",
    "Tally",
    "WorkerMetrics",
    "metrics",
    "read_count",
]

#: Bounds (seconds) of the job run-time and wait-time histograms: from a
#: tiny job's millisecond to an hour-long one.
JOB_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)
#: Bounds (seconds) of a store's commit-latency histogram.
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: How many of the last failures a queue keeps for ``procq top``.
RECENT_FAILURES = 20


class Histogram:
    """Counts of observations per fixed bucket, and their sum (caller holds the lock)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # (the first bound >= value: Prometheus' "le")
        self.sum += value

    def snapshot(self) -> HistogramSnapshot:
        return HistogramSnapshot(self.bounds, tuple(self.counts), self.sum)


@dataclass(frozen=True)
class HistogramSnapshot:
    """A histogram at one moment: ``counts[i]`` observations fell in
    ``(bounds[i-1], bounds[i]]``, the last count above every bound."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(le, observations <= le)`` per bound, +Inf last: Prometheus' buckets."""
        running = list(itertools.accumulate(self.counts))
        return [*zip(self.bounds, running[:-1], strict=True), (float("inf"), running[-1])]


def read_count(counter: itertools.count[int]) -> int:
    """How many times ``next()`` was called on an ``itertools.count()`` started at 0."""
    return int(repr(counter)[6:-1])  # "count(N)": the one way to read it without advancing it


class Tally:
    """One lane's counters. Each is changed where the state it follows
    changes, by that code, under ``Core.lock`` (``cached_unlocked`` aside:
    see the module docstring)."""

    __slots__ = (
        "cached",
        "cached_unlocked",
        "deaths",
        "failures",
        "joined",
        "live",
        "pushed",
        "run",
        "started",
        "starts",
        "wait",
    )

    def __init__(self) -> None:
        self.pushed = 0  # pushes that claimed the key: fresh work (Queued)
        self.joined = 0  # pushes that joined a live key (InFlight)
        self.cached = 0  # pushes answered from a completed key's record (Cached), under the lock
        self.cached_unlocked = itertools.count()  # the same, answered without it (read_count)
        self.started = 0  # attempts given to a worker
        self.failures: collections.Counter[str] = collections.Counter()  # jobs that ended failed, by kind
        self.live = 0  # the lane's live keys (Pending or Processing): the state map's claims minus its ends
        self.starts = 0  # worker processes that joined the lane
        self.deaths: collections.Counter[tuple[str, str]] = collections.Counter()  # (cause, signal or "")
        self.run = Histogram(JOB_BUCKETS)  # seconds from an attempt's start to its end
        self.wait = Histogram(JOB_BUCKETS)  # seconds from entering the lane (or the claim) to the start

    def died(self, retired: str | None, booting: bool, kind: str | None, signal: str | None, stopping: bool) -> None:
        """Count a worker's death by its cause: ``retired``, for a worker
        retired between jobs (``recycled``: its lane's ``max_jobs_per_worker``
        or ``max_worker_rss``; or its last job's failure kind, ``memory``),
        ``boot`` (before it was ready), the failure kind of the job it held
        (``crashed``, or why it was killed: ``timeout``, ``memory``,
        ``cancelled``, ``protocol``), ``stopped`` (idle, its queue stopping)
        or ``crashed`` (idle); a crash with the signal that ended it."""
        if retired is not None:
            cause = retired
        elif booting:
            cause = "boot"
        elif kind is not None:
            cause = kind
        else:
            cause = "stopped" if stopping else "crashed"
        self.deaths[cause, signal if cause == "crashed" and signal else ""] += 1


# --- the snapshot ------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerMetrics:
    """One worker: its process's resident memory and CPU time as the kernel
    counts them (0 when they could not be read, or it has no local process:
    a Dask lane's slot, whose ``pid`` is None), and the job it runs, if any."""

    pid: int | None
    lane: str
    memory_bytes: int
    cpu_seconds: float
    jobs: int  # jobs it has been given
    key: str | None  # the job it runs now
    running_seconds: float | None  # for how long (None: idle)


@dataclass(frozen=True)
class RecentFailure:
    """One of the queue's last failures (``RECENT_FAILURES`` kept)."""

    time: float  # when it ended (``time.time()``)
    key: str  # "" for a worker's death that failed no job (kind "worker")
    lane: str
    kind: str
    message: str


@dataclass(frozen=True)
class LaneMetrics:
    """One lane's counters, depths and workers at the moment of the snapshot."""

    name: str
    pushed: int
    joined: int
    cached: int
    started: int
    completed: int
    failed: dict[str, int]  # by failure kind
    retried: int
    waiting: int  # in the lane, waiting for a worker (blocked pushes included)
    scheduled: int  # Pending, not in the lane yet: waiting for a not_before time or a retry's backoff
    running: int
    workers: int  # the lane's limit
    workers_alive: int
    worker_starts: int
    worker_deaths: dict[str, int]  # by cause ("crashed:SIGSEGV" for a signal; see docs/observability.md)
    memory_bytes: int  # its workers' resident memory, summed
    run_seconds: HistogramSnapshot
    wait_seconds: HistogramSnapshot
    # What a sandbox's network allow-list refused the lane's jobs, by kind (see procq.Refused).
    sandbox_refused: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StoreMetrics:
    """A store's commits: their latency, and how long it refused them."""

    url: str
    commit_seconds: HistogramSnapshot
    outage_seconds: float  # in total, the current outage included
    available: bool  # the last commit went through
    writes_waiting: int  # writes not committed yet


@dataclass(frozen=True)
class QueueMetrics:
    """One snapshot of a queue (``ProcQueue.metrics()``)."""

    name: str
    pid: int
    time: float  # when it was taken (``time.time()``)
    stats: QueueStats  # exactly what ``q.stats()`` says at that moment
    lanes: dict[str, LaneMetrics]
    workers: list[WorkerMetrics]
    failures: list[RecentFailure]  # the last ones, oldest first
    store: StoreMetrics | None = field(default=None)

    def to_dict(self) -> dict[str, Any]:
        """As plain data (what ``procq top --once --json`` prints). Built by
        hand: ``dataclasses.asdict`` deep-copies every value, several times
        the cost of the snapshot itself."""
        lanes = {}
        for name, lane in self.lanes.items():
            fields = dict(vars(lane))
            fields["failed"] = dict(lane.failed)
            fields["worker_deaths"] = dict(lane.worker_deaths)
            fields["run_seconds"] = dict(vars(lane.run_seconds))
            fields["wait_seconds"] = dict(vars(lane.wait_seconds))
            lanes[name] = fields
        store = None
        if self.store is not None:
            store = dict(vars(self.store))
            store["commit_seconds"] = dict(vars(self.store.commit_seconds))
        return {
            "name": self.name, "pid": self.pid, "time": self.time, "stats": self.stats.to_dict(), "lanes": lanes,
            "workers": [dict(vars(w)) for w in self.workers], "failures": [dict(vars(f)) for f in self.failures],
            "store": store,
        }  # fmt: skip


def metrics(core: Core, name: str, read_store: bool = True) -> QueueMetrics:
    """Copy ``core``'s counters under its lock, then read its workers' memory
    and CPU time with no lock held (see the module docstring). With a store,
    its counts of ended keys are read first, as ``q.stats()`` does, unless
    not ``read_store``: then they are those of the last read."""
    read_counts = getattr(core, "read_counts", None)
    if read_store and read_counts is not None:
        from procq._stores.base import StoreUnavailable

        with contextlib.suppress(StoreUnavailable):  # (an outage is when metrics matter most: the last counts, then)
            read_counts()
    lanes: dict[str, dict[str, Any]] = {}
    procs: list[tuple[int | None, str, int, str | None, float | None]] = []
    with core.lock:
        now = core.clock()
        stats = core.keys.stats(now, core.dispatch.stats())
        failures = list(core.keys.failures)
        for lane_name, lane in core.lanes.items():
            t = lane.tally
            s = stats.lanes[lane_name]
            lanes[lane_name] = {
                "name": lane_name, "pushed": t.pushed, "joined": t.joined, "cached": t.cached,
                "started": t.started, "completed": lane.completed, "failed": dict(t.failures),
                "retried": lane.retries, "waiting": s.waiting,
                "scheduled": max(0, t.live - lane.running - s.waiting), "running": lane.running,
                "workers": lane.spec.workers, "workers_alive": s.workers_alive, "worker_starts": t.starts,
                "worker_deaths": {f"{c}:{sig}" if sig else c: n for (c, sig), n in t.deaths.items()},
                "run_seconds": t.run.snapshot(), "wait_seconds": t.wait.snapshot(), "_unlocked": t.cached_unlocked,
                "sandbox_refused": lane.refusals.by_kind(),
            }  # fmt: skip
            for w in lane.workers:
                e = w.entry
                procs.append((w.pid, lane_name, w.jobs, None if e is None else e.key,
                              None if e is None else now - w.started))  # fmt: skip
    store = _store_metrics(core)
    workers = [_worker(*p) for p in procs]
    memory = collections.Counter[str]()
    for one in workers:
        memory[one.lane] += one.memory_bytes
    lane_metrics = {}
    for lane_name, fields in lanes.items():
        fields["cached"] += read_count(fields.pop("_unlocked"))
        lane_metrics[lane_name] = LaneMetrics(memory_bytes=memory[lane_name], **fields)
    recent = [RecentFailure(*f) for f in failures]
    return QueueMetrics(name, os.getpid(), time.time(), stats, lane_metrics, workers, recent, store)


def _worker(pid: int | None, lane: str, jobs: int, key: str | None, running: float | None) -> WorkerMetrics:
    from procq._system.processes import process_rss

    if pid is None:
        return WorkerMetrics(pid, lane, 0, 0.0, jobs, key, running)
    return WorkerMetrics(pid, lane, process_rss(pid), _cpu_seconds(pid), jobs, key, running)


def _cpu_seconds(pid: int) -> float:
    """A process's user and system CPU time (0 if it is gone): /proc where there is one, else psutil."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        times = psutil.Process(pid).cpu_times()
        return float(times.user + times.system)
    except Exception:  # it died meanwhile: its death is being handled
        return 0.0


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _store_metrics(core: Core) -> StoreMetrics | None:
    commits = getattr(core, "commits", None)
    if commits is None:
        return None
    return StoreMetrics(core.store.url, *commits.metrics())  # type: ignore[attr-defined]
