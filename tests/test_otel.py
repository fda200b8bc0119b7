"""procq.metrics.otel: the same counts as ``q.metrics()`` through OpenTelemetry's
SDK (in-memory reader and exporter), and one span per job under the span
current at its push."""

from __future__ import annotations

from typing import Any

from core_support import Gates, open_queue
from observe_support import EXPECTED, require, run_workload

require("opentelemetry.sdk", "otel")

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402

from procq.metrics import otel  # noqa: E402


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    """Every data point of one collection, by instrument name."""
    found: dict[str, list[Any]] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def one(found: dict[str, list[Any]], name: str, **attrs: str) -> Any:
    (point,) = [p for p in found[name] if all(p.attributes.get(k) == v for k, v in attrs.items())]
    return point


def test_the_same_numbers_and_one_span_per_job_under_its_pushers_span(gates: Gates) -> None:
    reader = InMemoryMetricReader()
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[reader])
    tracer = tracer_provider.get_tracer("test")
    try:
        with open_queue({"cpu": 2, "io": 1}, name="traced") as q:
            instrumentation = otel.instrument(q, meter_provider=meter_provider, tracer_provider=tracer_provider)
            with tracer.start_as_current_span("request") as request:
                run_workload(q, gates)
            found = points(reader)
            m = q.metrics()
            instrumentation.close()
    finally:
        meter_provider.shutdown()
        tracer_provider.shutdown()
    cpu = {"procq.queue": "traced", "procq.lane": "cpu"}
    lane = m.lanes["cpu"]
    for name, field in (("pushed", "pushed"), ("joined", "joined"), ("cached", "cached"), ("started", "started"),
                        ("completed", "completed")):  # fmt: skip
        assert one(found, f"procq.jobs.{name}", **cpu).value == getattr(lane, field) == EXPECTED[field]
    assert one(found, "procq.jobs.failed", **cpu, **{"procq.failure.kind": "crashed"}).value == 1
    assert one(found, "procq.jobs.failed", **cpu, **{"procq.failure.kind": "timeout"}).value == 1
    assert (
        one(found, "procq.worker.deaths", **cpu, **{"procq.worker.cause": "crashed", "procq.signal": "SIGSEGV"}).value
        == 1
    )
    assert one(found, "procq.worker.deaths", **cpu, **{"procq.worker.cause": "timeout"}).value == 1
    assert one(found, "procq.worker.starts", **cpu).value == EXPECTED["worker_starts"]
    assert one(found, "procq.workers.alive", **cpu).value == 2
    assert one(found, "procq.keys", **{"procq.queue": "traced", "procq.state": "completed"}).value == 4
    assert one(found, "procq.job.run_time", **cpu).count == 6
    assert one(found, "procq.job.wait_time", **cpu).count == 6

    spans = [s for s in exporter.get_finished_spans() if s.name == "procq.job"]
    outcomes = {s.attributes["procq.key"]: s.attributes["procq.outcome"] for s in spans}  # type: ignore[index]
    assert outcomes == {
        "k1": "completed", "k2": "completed", "k3": "completed", "held": "completed",
        "crash": "crashed", "slow": "timeout",
    }  # fmt: skip
    parent = request.get_span_context()
    for span in spans:
        assert span.parent is not None and span.parent.span_id == parent.span_id
        assert span.context.trace_id == parent.trace_id
        assert [e.name for e in span.events] == ["queued", "started"]
        assert span.attributes["procq.lane"] == "cpu" and span.attributes["procq.queue"] == "traced"  # type: ignore[index]
        assert span.attributes["procq.worker.pid"] > 0  # type: ignore[index,operator]
        assert span.start_time <= span.events[1].timestamp <= span.end_time  # type: ignore[operator]
        assert (span.status.status_code is StatusCode.ERROR) == (span.attributes["procq.outcome"] != "completed")  # type: ignore[index]
