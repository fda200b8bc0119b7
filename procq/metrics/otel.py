"""A queue's metrics and a span per job for OpenTelemetry (``pip install 'procq[otel]'``: the API package)::

    from procq.metrics import otel

    q = ProcQueue(lanes={"cpu": 4}, name="enrich")
    otel.instrument(q)   # the global meter and tracer providers, unless given

**Metrics**: observable instruments over ``q.metrics()`` (read when the SDK
collects; nothing is computed between collections), with the attributes
``procq.queue`` and ``procq.lane``: the counters ``procq.jobs.pushed``,
``.joined``, ``.cached``, ``.started``, ``.completed``, ``.failed`` (with
``procq.failure.kind``), ``.retried``, ``procq.worker.starts`` and
``procq.worker.deaths`` (with ``procq.worker.cause`` and ``procq.signal``),
``procq.sandbox.refused`` (with ``procq.sandbox.what``: what a network
allow-list refused); the up-down counters ``procq.jobs.waiting``, ``.scheduled``, ``.running``,
``procq.workers.alive``, ``procq.workers.memory`` (bytes) and
``procq.keys`` (with ``procq.state``). The API has no observable histogram,
so ``procq.job.run_time`` and ``procq.job.wait_time`` (seconds) are
recorded as each job ends (its last attempt), from then on.

**Spans**: one per job pushed from then on (not per join nor cached
answer), named ``procq.job``, from its push to its end, whose parent is the
span current where it was pushed (thread or task), so a traced request
shows the jobs it caused. Events ``queued`` and ``started`` (its last
attempt); attributes ``procq.key``, ``procq.lane``, ``procq.queue``,
``procq.outcome`` (``completed`` or the failure kind), ``procq.worker.pid``,
``procq.attempts``; a failure sets the span's status to ERROR. Spans end
on the thread that ends the job (often the supervisor's I/O thread): give
the tracer provider a ``BatchSpanProcessor``, whose ``on_end`` only queues.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from opentelemetry import context, trace
from opentelemetry import metrics as otel_metrics
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.trace import Status, StatusCode, TracerProvider

from procq import __version__
from procq._core.entries import Entry
from procq._core.metrics import QueueMetrics
from procq._model.values import Completed

if TYPE_CHECKING:
    from procq._api.queue import ProcQueue

__all__ = ["Instrumentation", "instrument"]

# (instrument, field of LaneMetrics, description): counters, then up-down counters.
_COUNTERS = (
    ("procq.jobs.pushed", "pushed", "Pushes that claimed their key: fresh work"),
    ("procq.jobs.joined", "joined", "Pushes that joined a pending or running job of the same key"),
    ("procq.jobs.cached", "cached", "Pushes answered from a completed key's stored output"),
    ("procq.jobs.started", "started", "Attempts handed to a worker process"),
    ("procq.jobs.completed", "completed", "Jobs that ended Completed"),
    ("procq.jobs.retried", "retried", "Failed attempts that a Retry ran again"),
    ("procq.worker.starts", "worker_starts", "Worker processes that joined the lane"),
)
_GAUGES = (
    ("procq.jobs.waiting", "waiting", "{job}", "Jobs in the lane waiting for a worker"),
    ("procq.jobs.scheduled", "scheduled", "{job}", "Pending jobs waiting for their time or a retry backoff"),
    ("procq.jobs.running", "running", "{job}", "Jobs a worker runs now"),
    ("procq.workers.alive", "workers_alive", "{process}", "Worker processes alive or being started"),
    ("procq.workers.memory", "memory_bytes", "By", "Resident memory of the lane's worker processes"),
)


class Instrumentation:
    """What ``instrument`` set up for one queue; ``close()`` stops it."""

    def __init__(
        self, queue: ProcQueue, meter_provider: MeterProvider | None, tracer_provider: TracerProvider | None
    ) -> None:
        self._queue = weakref.ref(queue)
        self._name = queue.name
        self._snapshot: QueueMetrics | None = None
        self._closed = False
        meter = (meter_provider or otel_metrics.get_meter_provider()).get_meter("procq", __version__)
        self._tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer("procq", __version__)
        first = True
        for name, field, doc in _COUNTERS:
            meter.create_observable_counter(name, [self._lane_callback(field, first)], "{job}", doc)
            first = False
        meter.create_observable_counter(
            "procq.jobs.failed",
            [self._by_kind("failed", "procq.failure.kind")],
            "{job}",
            "Jobs that ended Failed, by failure kind",
        )
        meter.create_observable_counter(
            "procq.worker.deaths", [self._deaths], "{process}", "Worker processes that ended, by cause"
        )
        meter.create_observable_counter(
            "procq.sandbox.refused",
            [self._by_kind("sandbox_refused", "procq.sandbox.what")],
            "{connection}",
            "What a sandbox's network allow-list refused",
        )
        for name, field, unit, doc in _GAUGES:
            meter.create_observable_up_down_counter(name, [self._lane_callback(field, False)], unit, doc)
        meter.create_observable_up_down_counter("procq.keys", [self._keys], "{key}", "Keys the queue holds, by state")
        self._run = meter.create_histogram("procq.job.run_time", "s", "Seconds from a job's (last) start to its end")
        self._wait = meter.create_histogram("procq.job.wait_time", "s", "Seconds a job waited before its (last) start")
        self._core = queue._core
        queue._pusher.on_fresh = self._fresh

    def close(self) -> None:
        """Stop: no more spans or histogram records, and the instruments observe nothing."""
        self._closed = True
        queue = self._queue()
        if queue is not None and queue._pusher.on_fresh == self._fresh:
            queue._pusher.on_fresh = None

    # --- metrics -----------------------------------------------------------------------

    def _take(self, fresh: bool) -> QueueMetrics | None:
        """The snapshot of this collection: the first instrument's callback takes it, the others read it."""
        queue = self._queue()
        if queue is None or self._closed:
            return None
        if fresh or self._snapshot is None:
            self._snapshot = queue.metrics()
        return self._snapshot

    def _lane_callback(self, field: str, fresh: bool) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            m = self._take(fresh)
            if m is None:
                return []
            return [Observation(getattr(lane, field), self._attrs(lane.name)) for lane in m.lanes.values()]

        return observe

    def _by_kind(self, field: str, attribute: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        """A callback observing each lane's counts by kind (``LaneMetrics.<field>``), the kind as ``attribute``."""

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            m = self._take(False)
            if m is None:
                return []
            return [
                Observation(n, {**self._attrs(lane.name), attribute: kind})
                for lane in m.lanes.values()
                for kind, n in sorted(getattr(lane, field).items())
            ]

        return observe

    def _deaths(self, options: CallbackOptions) -> Iterable[Observation]:
        m = self._take(False)
        if m is None:
            return []
        found = []
        for lane in m.lanes.values():
            for cause, n in sorted(lane.worker_deaths.items()):
                what, _, sig = cause.partition(":")
                found.append(
                    Observation(n, {**self._attrs(lane.name), "procq.worker.cause": what, "procq.signal": sig})
                )
        return found

    def _keys(self, options: CallbackOptions) -> Iterable[Observation]:
        m = self._take(False)
        if m is None:
            return []
        s = m.stats
        states = (
            ("pending", s.pending),
            ("processing", s.processing),
            ("completed", s.completed),
            ("failed", s.failed),
        )
        return [Observation(n, {"procq.queue": self._name, "procq.state": state}) for state, n in states]

    def _attrs(self, lane: str) -> dict[str, str]:
        return {"procq.queue": self._name, "procq.lane": lane}

    # --- a job's span --------------------------------------------------------------

    def _fresh(self, entry: Entry) -> None:
        """A fresh job is offered (in the pushing thread): remember the current
        context and the time; its span is made when it ends (``_ended``)."""
        if self._closed:
            return
        parent = context.get_current()
        core = self._core
        base = (time.time_ns(), core.clock())
        lane = entry.lane.name

        def ended() -> None:
            self._ended(entry, parent, base, lane)

        if not core.add_callback(entry, ended):
            ended()

    def _ended(self, entry: Entry, parent: context.Context, base: tuple[int, float], lane: str) -> None:
        """Make the span of a job that ended (no lock held), and record its times."""
        if self._closed:
            return
        wall, mono = base
        now = self._core.clock()

        def at(t: float) -> int:  # a time of the core's clock, in ns since the epoch
            return wall + int((t - mono) * 1e9)

        outcome = entry.outcome
        failure = None if type(outcome) is Completed else getattr(outcome, "failure", None)
        attrs: dict[str, Any] = {
            "procq.key": entry.key, "procq.lane": lane, "procq.queue": self._name,
            "procq.outcome": "completed" if failure is None else failure.kind, "procq.attempts": entry.attempt,
        }  # fmt: skip
        ran = entry.pid is not None
        if ran:
            attrs["procq.worker.pid"] = entry.pid
            self._run.record(max(0.0, now - entry.started), self._attrs(lane))
            self._wait.record(max(0.0, entry.started - entry.since), self._attrs(lane))
        span = self._tracer.start_span("procq.job", context=parent, start_time=wall, attributes=attrs)
        span.add_event("queued", timestamp=wall)
        if ran:
            span.add_event("started", timestamp=at(entry.started))
        if failure is not None:
            span.set_status(Status(StatusCode.ERROR, str(failure)[:500]))
        span.end(end_time=max(wall, at(now)))


def instrument(
    queue: ProcQueue, *, meter_provider: MeterProvider | None = None, tracer_provider: TracerProvider | None = None
) -> Instrumentation:
    """Export ``queue``'s metrics and a span per job through OpenTelemetry
    (see the module docstring); returns what ``close()`` stops."""
    return Instrumentation(queue, meter_provider, tracer_provider)
