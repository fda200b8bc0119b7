"""A queue's metrics for Prometheus, through ``prometheus_client`` (``pip install 'procq[prometheus]'``)::

    from procq.metrics import prometheus

    with ProcQueue(lanes={"cpu": 4}, name="enrich") as q:
        prometheus.register(q)          # into prometheus_client's default registry
        prometheus.serve(q, port=9464)  # or: an HTTP endpoint of its own, /metrics
        ...

The collector reads ``q.metrics()`` at each scrape (nothing is kept or
computed between scrapes) and holds the queue weakly: a queue that is gone
exports nothing. Every series has the labels ``queue`` (``q.name``) and,
for a lane's, ``lane``; counters end in ``_total``, durations are in
seconds, sizes in bytes. The list, with what each one means, is in
docs/observability.md.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, get_args

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from procq._core.metrics import HistogramSnapshot, QueueMetrics
from procq._model.values import FailureKind

if TYPE_CHECKING:
    from procq._api.queue import ProcQueue

__all__ = ["ProcQueueCollector", "register", "serve"]

_KINDS: tuple[str, ...] = get_args(FailureKind)

# (name without _total, help, field of LaneMetrics)
_LANE_COUNTERS = (
    ("procq_jobs_pushed", "Pushes that claimed their key: fresh work (Queued).", "pushed"),
    ("procq_jobs_joined", "Pushes that joined a pending or running job of the same key (InFlight).", "joined"),
    ("procq_jobs_cached", "Pushes answered from a completed key's stored output (Cached); nothing ran.", "cached"),
    ("procq_jobs_started", "Attempts handed to a worker process (a retried job counts each attempt).", "started"),
    ("procq_jobs_completed", "Jobs that ended Completed.", "completed"),
    ("procq_jobs_retried", "Failed attempts that a Retry ran again.", "retried"),
    (
        "procq_worker_starts",
        "Worker processes that joined the lane (first ones, replacements, spares).",
        "worker_starts",
    ),
)
_LANE_GAUGES = (
    ("procq_jobs_waiting", "Jobs in the lane waiting for a worker, blocked pushes included.", "waiting"),
    ("procq_jobs_scheduled", "Pending jobs not in their lane yet: waiting for not_before or a backoff.", "scheduled"),
    ("procq_jobs_running", "Jobs a worker is running now.", "running"),
    ("procq_workers_alive", "Worker processes alive or being started.", "workers_alive"),
    ("procq_workers_max", "The lane's worker limit.", "workers"),
    ("procq_workers_memory_bytes", "Resident memory of the lane's worker processes, summed.", "memory_bytes"),
)  # fmt: skip


class ProcQueueCollector(Collector):
    """A ``prometheus_client`` collector of one queue (see the module docstring)."""

    def __init__(self, queue: ProcQueue) -> None:
        self._queue = weakref.ref(queue)

    def describe(self) -> Iterable[Metric]:
        return []  # (unchecked: the series follow the queue's lanes)

    def collect(self) -> Iterator[Metric]:
        queue = self._queue()
        if queue is None:
            return
        yield from families(queue.metrics())


def families(m: QueueMetrics) -> Iterator[Metric]:
    """Every metric family of one snapshot."""
    q = m.name
    lanes = m.lanes.values()
    for name, doc, field in _LANE_COUNTERS:
        family = CounterMetricFamily(name, doc, labels=["queue", "lane"])
        for lane in lanes:
            family.add_metric([q, lane.name], getattr(lane, field))
        yield family
    failed = CounterMetricFamily(
        "procq_jobs_failed", "Jobs that ended Failed, by failure kind.", labels=["queue", "lane", "kind"]
    )
    deaths = CounterMetricFamily(
        "procq_worker_deaths",
        "Worker processes that ended, by cause (crashed, timeout, memory, cancelled, protocol, recycled, boot, "
        "stopped) and, for a crash, the signal that ended it.",
        labels=["queue", "lane", "cause", "signal"],
    )  # fmt: skip
    for lane in lanes:
        for kind in sorted({*_KINDS, *lane.failed}):
            failed.add_metric([q, lane.name, kind], lane.failed.get(kind, 0))
        for cause, n in sorted(lane.worker_deaths.items()):
            what, _, sig = cause.partition(":")
            deaths.add_metric([q, lane.name, what, sig], n)
    yield failed
    yield deaths
    refused = CounterMetricFamily(
        "procq_sandbox_refused",
        "Connections a sandbox's network allow-list refused, by kind (not-listed, rebinding, sni, nested, udp, "
        "malformed, limit).",
        labels=["queue", "lane", "what"],
    )  # fmt: skip
    for lane in lanes:
        for what, n in sorted(lane.sandbox_refused.items()):
            refused.add_metric([q, lane.name, what], n)
    yield refused
    for name, doc, field in _LANE_GAUGES:
        gauge = GaugeMetricFamily(name, doc, labels=["queue", "lane"])
        for lane in lanes:
            gauge.add_metric([q, lane.name], getattr(lane, field))
        yield gauge
    run = HistogramMetricFamily(
        "procq_job_run_seconds", "Seconds from an attempt's start to its end.", labels=["queue", "lane"]
    )
    wait = HistogramMetricFamily(
        "procq_job_wait_seconds", "Seconds a job waited (from its push, or its due time) before it started.",
        labels=["queue", "lane"],
    )  # fmt: skip
    for lane in lanes:
        _observe(run, [q, lane.name], lane.run_seconds)
        _observe(wait, [q, lane.name], lane.wait_seconds)
    yield run
    yield wait
    keys = GaugeMetricFamily("procq_keys", "Keys the queue holds, by state.", labels=["queue", "state"])
    s = m.stats
    for state, n in (
        ("pending", s.pending),
        ("processing", s.processing),
        ("completed", s.completed),
        ("failed", s.failed),
    ):
        keys.add_metric([q, state], n)
    yield keys
    if m.store is not None:
        st = m.store
        commit = HistogramMetricFamily(
            "procq_store_commit_seconds", "Seconds each commit to the store took.", labels=["queue"]
        )
        _observe(commit, [q], st.commit_seconds)
        yield commit
        outage = "Seconds the store refused commits, in total (the current outage included)."
        yield _one(CounterMetricFamily, "procq_store_outage_seconds", outage, q, st.outage_seconds)
        yield _one(
            GaugeMetricFamily,
            "procq_store_up",
            "1 while the store takes commits, 0 while it refuses them.",
            q,
            int(st.available),
        )
        yield _one(GaugeMetricFamily, "procq_store_writes_waiting", "Writes not committed yet.", q, st.writes_waiting)


def _one(
    kind: type[CounterMetricFamily] | type[GaugeMetricFamily], name: str, doc: str, queue: str, value: float
) -> Metric:
    family = kind(name, doc, labels=["queue"])
    family.add_metric([queue], value)
    return family


def _observe(family: HistogramMetricFamily, labels: list[str], h: HistogramSnapshot) -> None:
    buckets = [("+Inf" if le == float("inf") else repr(float(le)), n) for le, n in h.cumulative()]
    family.add_metric(labels, buckets, h.sum)


def register(queue: ProcQueue, registry: CollectorRegistry = REGISTRY) -> ProcQueueCollector:
    """Register a collector of ``queue`` in ``registry`` (prometheus_client's
    default registry unless given); returns it, for ``registry.unregister``."""
    collector = ProcQueueCollector(queue)
    registry.register(collector)
    return collector


def serve(queue: ProcQueue, port: int = 9464, addr: str = "127.0.0.1") -> tuple[object, object]:
    """Serve ``queue``'s metrics (alone, in a registry of their own) over
    HTTP on ``addr:port`` (``/metrics``), from a daemon thread. Returns
    prometheus_client's ``(server, thread)``: ``server.shutdown()`` stops it."""
    registry = CollectorRegistry(auto_describe=False)
    register(queue, registry)
    server, thread = start_http_server(port, addr, registry)
    return server, thread
