"""The metrics a queue keeps (``q.metrics()``) and their Prometheus exposition,
after a known workload; read back with prometheus_client's own parser."""

from __future__ import annotations

import os
import sqlite3
import urllib.request
from pathlib import Path
from typing import Any

import jobs
import jobs_control
import pytest
from core_support import WAIT, Gate, Gates, open_queue, wait_until
from observe_support import EXPECTED, require, run_workload

from procq import Job, JobFailed, Lane, ProcQueue, Queued, SqliteStore

require("prometheus_client", "prometheus")

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from procq.metrics import prometheus  # noqa: E402


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition, by name and labels, through prometheus_client's parser."""
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[s.name, frozenset(s.labels.items())] = s.value
    return found


def value(found: dict[Any, float], name: str, **labels: str) -> float:
    return found[name, frozenset(labels.items())]


def test_q_metrics_counts_a_known_workload(gates: Gates) -> None:
    with open_queue({"cpu": 2, "io": 1}, name="counted") as q:
        run_workload(q, gates)
        m = q.metrics()
        stats = q.stats()
    cpu = m.lanes["cpu"]
    assert m.name == "counted" and m.pid == os.getpid()
    assert (cpu.pushed, cpu.joined, cpu.cached, cpu.started) == (6, 1, 1, 6)
    assert cpu.completed == EXPECTED["completed"] and cpu.failed == EXPECTED["failed"]
    assert cpu.worker_deaths == EXPECTED["deaths"]
    assert cpu.worker_starts == EXPECTED["worker_starts"]
    assert (cpu.waiting, cpu.scheduled, cpu.running, cpu.workers_alive) == (0, 0, 0, 2)
    assert cpu.run_seconds.count == 6 and cpu.wait_seconds.count == 6
    assert cpu.run_seconds.sum >= 0.3  # the timed-out job ran at least its timeout
    assert [f.key for f in m.failures] == ["crash", "slow"] and [f.kind for f in m.failures] == ["crashed", "timeout"]
    assert m.stats == stats
    assert {w.lane for w in m.workers} == {"cpu", "io"} and all(w.memory_bytes > 0 for w in m.workers)
    io = m.lanes["io"]
    assert (io.pushed, io.started, io.worker_starts, io.completed) == (0, 0, 1, 0)


def test_a_scrape_shows_the_exact_counts(gates: Gates) -> None:
    registry = CollectorRegistry()
    with open_queue({"cpu": 2, "io": 1}, name="scraped") as q:
        prometheus.register(q, registry)
        run_workload(q, gates)
        found = samples(generate_latest(registry).decode())
    lane = {"queue": "scraped", "lane": "cpu"}
    assert value(found, "procq_jobs_pushed_total", **lane) == 6
    assert value(found, "procq_jobs_joined_total", **lane) == 1
    assert value(found, "procq_jobs_cached_total", **lane) == 1
    assert value(found, "procq_jobs_started_total", **lane) == 6
    assert value(found, "procq_jobs_completed_total", **lane) == 4
    assert value(found, "procq_jobs_failed_total", kind="crashed", **lane) == 1
    assert value(found, "procq_jobs_failed_total", kind="timeout", **lane) == 1
    assert value(found, "procq_jobs_failed_total", kind="error", **lane) == 0
    assert value(found, "procq_worker_deaths_total", cause="crashed", signal="SIGSEGV", **lane) == 1
    assert value(found, "procq_worker_deaths_total", cause="timeout", signal="", **lane) == 1
    assert value(found, "procq_worker_starts_total", **lane) == 4
    assert value(found, "procq_workers_alive", **lane) == 2
    assert value(found, "procq_jobs_running", **lane) == 0
    assert value(found, "procq_job_run_seconds_count", **lane) == 6
    assert value(found, "procq_job_run_seconds_bucket", le="+Inf", **lane) == 6
    assert value(found, "procq_job_wait_seconds_count", **lane) == 6
    assert value(found, "procq_keys", queue="scraped", state="completed") == 4
    assert value(found, "procq_keys", queue="scraped", state="failed") == 2
    assert value(found, "procq_workers_memory_bytes", **lane) > 0


def test_a_collected_queue_exports_nothing() -> None:
    registry = CollectorRegistry()
    q = ProcQueue(1, name="gone")
    prometheus.register(q, registry)
    q.close()
    assert "procq_jobs_pushed_total" in generate_latest(registry).decode()
    del q
    assert "procq_" not in generate_latest(registry).decode()


def test_the_http_endpoint_serves_the_queue() -> None:
    with open_queue(1, name="served") as q:
        assert q.push_and_wait(Job("a", jobs.square, args=(4,)), timeout=WAIT) == 16
        server, thread = prometheus.serve(q, port=0)
        try:
            port = server.server_port  # type: ignore[attr-defined]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT) as response:
                found = samples(response.read().decode())
        finally:
            server.shutdown()  # type: ignore[attr-defined]
            server.server_close()  # type: ignore[attr-defined]
            thread.join(WAIT)  # type: ignore[attr-defined]
    assert value(found, "procq_jobs_completed_total", queue="served", lane="default") == 1


def test_a_store_counts_its_commits(tmp_path: Any) -> None:
    registry = CollectorRegistry()
    with open_queue(1, name="stored", store=str(tmp_path / "keys.db")) as q:
        prometheus.register(q, registry)
        for i in range(3):
            assert q.push_and_wait(Job(f"s{i}", jobs.square, args=(i,)), timeout=WAIT) == i * i
        assert q.push(Job("s1", jobs.square, args=(1,))).output == 1  # type: ignore[union-attr]
        m = q.metrics()
        found = samples(generate_latest(registry).decode())
    assert m.store is not None and m.store.available and m.store.outage_seconds == 0
    assert m.store.commit_seconds.count >= 1
    assert m.lanes["default"].cached == 1 and m.lanes["default"].completed == 3
    assert value(found, "procq_store_up", queue="stored") == 1
    assert value(found, "procq_store_commit_seconds_count", queue="stored") >= 1
    assert value(found, "procq_store_outage_seconds_total", queue="stored") == 0


def test_names_are_checked() -> None:
    with pytest.raises(TypeError, match="a queue's name is a str"):
        ProcQueue(1, name=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="without '/'"):
        ProcQueue(1, name="a/b")
    with pytest.raises(TypeError, match="monitor must be True or False"):
        ProcQueue(1, monitor="yes")  # type: ignore[arg-type]


def test_a_store_outage_is_timed(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    gate = Gate(tmp_path, "g")
    registry = CollectorRegistry()
    try:
        with ProcQueue(1, store=SqliteStore(db, lease=1.0, busy=0.1), name="outage") as q:
            prometheus.register(q, registry)
            running = q.push(Job("slow", jobs.signal_and_wait, args=(gate.started, gate.go)))
            assert isinstance(running, Queued)
            gate.wait_started()
            locker = sqlite3.connect(db, isolation_level=None)
            locker.execute("BEGIN IMMEDIATE")
            try:
                gate.open()  # the job ends; its outcome cannot be committed
                wait_until(lambda: not q.metrics().store.available, what="the refusal")  # type: ignore[union-attr]
                during = q.metrics().store
                assert during is not None and during.writes_waiting >= 1
                down = samples(generate_latest(registry).decode())
                assert value(down, "procq_store_up", queue="outage") == 0
            finally:
                locker.execute("ROLLBACK")
                locker.close()
            running.handle.result(timeout=WAIT)
            after = q.metrics().store
    finally:
        gate.close()
    assert after is not None and after.available and after.writes_waiting == 0
    assert after.outage_seconds > 0 and after.outage_seconds >= during.outage_seconds


def test_deaths_by_recycling_and_by_memory() -> None:
    lanes = {"r": Lane(workers=1, max_jobs_per_worker=2), "m": Lane(workers=1, memory_limit="64M")}
    with open_queue(lanes) as q:
        for i in range(4):
            q.push_and_wait(Job(f"r{i}", jobs.getpid, lane="r"), timeout=WAIT)
        with pytest.raises(JobFailed, match="memory"):
            q.push_and_wait(Job("greedy", jobs_control.allocate, args=(300,), lane="m"), timeout=WAIT)

        def counted() -> bool:
            m = q.metrics()
            deaths = m.lanes["r"].worker_deaths == {"recycled": 2} and m.lanes["m"].worker_deaths == {"memory": 1}
            return deaths and (m.lanes["r"].worker_starts, m.lanes["m"].worker_starts) == (3, 2)

        # (A replacement's start is counted once it is started, after the death.)
        wait_until(counted, what="the retired workers' deaths and their replacements' starts counted")
        m = q.metrics()
        assert (m.lanes["r"].worker_starts, m.lanes["m"].worker_starts) == (3, 2)
