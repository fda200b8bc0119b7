"""Exporters of a queue's metrics (``ProcQueue.metrics()``) to monitoring systems.

- ``procq.metrics.prometheus``: a ``prometheus_client`` collector
  (``register(q)``) and an optional HTTP endpoint (``serve(q, port)``);
  ``pip install 'procq[prometheus]'``.
- ``procq.metrics.otel``: OpenTelemetry observable instruments and a span
  per job (``instrument(q)``); ``pip install 'procq[otel]'``.

Each reads the same snapshot, taken when it is read: a queue that nobody
scrapes pays only for its counters. What each metric means is in
docs/observability.md.
"""
