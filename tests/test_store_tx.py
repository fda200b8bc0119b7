"""A store's transactions, wakes across processes, and its database going away.

Real databases only: a SQLite file in the test's directory and a throwaway
PostgreSQL server (``pg_server``; ``own_pg_server`` for the test that stops
and restarts its server)."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import jobs
import pytest
import store_jobs
from core_support import WAIT, Gate, wait_until
from pg_server import PgServer

from procq import (
    Cached,
    Failed,
    InFlight,
    Job,
    JobFailed,
    Pending,
    ProcQueue,
    ProcQueueError,
    Queued,
    SqliteStore,
    StoreUnavailable,
)
from procq._stores.urls import open_store

PROGRAM = str(Path(__file__).with_name("store_program.py"))


def mark(url: str) -> str:
    """The parameter mark of the store's DB-API driver."""
    return "?" if url.startswith("sqlite") else "%s"


def outside(url: str, sql: str) -> list[tuple[object, ...]]:
    """Run ``sql`` on a connection of its own (what another program would see)."""
    if url.startswith("sqlite"):
        db = sqlite3.connect(url[len("sqlite:///") :], isolation_level=None)
        try:
            return db.execute(sql).fetchall()
        finally:
            db.close()
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        cur = con.execute(sql)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description is not None else []


@pytest.fixture
def table(url: str) -> Iterator[str]:
    """An application table of the caller's own, beside procq's."""
    outside(url, "CREATE TABLE batches (name TEXT)")
    yield "batches"


# --- q.transaction() -----------------------------------------------------------------


def test_a_transaction_commits_the_callers_rows_and_then_starts_its_jobs(url: str, table: str, tmp_path: Path) -> None:
    log = tmp_path / "log"
    with ProcQueue(1, store=url) as q:
        with q.transaction() as tx:
            tx.execute(f"INSERT INTO batches (name) VALUES ({mark(url)})", ("b1",))
            pushed = tx.push(Job("b1/load", store_jobs.counted, args=(str(log), "loaded")))
            assert isinstance(pushed, Queued)
            # Answered now, started at commit: the job is not in its lane yet.
            assert q.state("b1/load") == Pending() and not log.exists()
            again = tx.push(Job("b1/load", store_jobs.counted, args=(str(log), "loaded")))
            assert isinstance(again, InFlight)
            many = tx.push_all([Job(f"b1/part{i}", store_jobs.echo, args=(i,)) for i in range(3)])
            assert all(isinstance(p, Queued) for p in many)
        assert pushed.handle.result(timeout=WAIT) == "loaded"
        assert [p.handle.result(timeout=WAIT) for p in many] == [0, 1, 2]  # type: ignore[union-attr]
    assert outside(url, "SELECT name FROM batches") == [("b1",)]
    assert sorted(r[0] for r in outside(url, "SELECT key FROM procq_keys WHERE state = 'done'")) == [
        "b1/load", "b1/part0", "b1/part1", "b1/part2",
    ]  # fmt: skip
    assert log.read_text().count("loaded") == 1


def test_a_rolled_back_transaction_leaves_no_trace(url: str, table: str, tmp_path: Path) -> None:
    log = tmp_path / "log"
    with ProcQueue(1, store=url) as q:
        with pytest.raises(RuntimeError, match="the caller changed its mind"), q.transaction() as tx:
            tx.execute(f"INSERT INTO batches (name) VALUES ({mark(url)})", ("b2",))
            pushed = tx.push(Job("b2/load", store_jobs.counted, args=(str(log), "loaded")))
            joined = q.push(Job("b2/load", store_jobs.counted, args=(str(log), "loaded")))
            assert isinstance(pushed, Queued) and isinstance(joined, InFlight)
            raise RuntimeError("the caller changed its mind")
        for handle in (pushed.handle, joined.handle):
            with pytest.raises(JobFailed) as info:
                handle.result(timeout=WAIT)
            assert info.value.failure.kind == "cancelled"
            assert "rolled back" in info.value.failure.message
        assert q.state("b2/load") is None
        assert outside(url, "SELECT name FROM batches") == []
        assert outside(url, "SELECT key FROM procq_keys") == []
        # The key is free: a plain push runs it.
        assert q.push_and_wait(Job("b2/load", store_jobs.counted, args=(str(log), "loaded")), timeout=WAIT) == "loaded"
    assert log.read_text().count("loaded") == 1


def test_a_transaction_over_a_completed_key_answers_cached_and_keeps_it(url: str, table: str) -> None:
    with ProcQueue(1, store=url) as q:
        assert q.push_and_wait(Job("done", store_jobs.echo, args=(5,)), timeout=WAIT) == 5
        with pytest.raises(KeyError), q.transaction() as tx:
            assert tx.push(Job("done", store_jobs.echo, args=(5,))) == Cached(5)
            raise KeyError("rolled back")
        assert q.push(Job("done", store_jobs.echo, args=(5,))) == Cached(5)


def test_other_threads_wait_for_an_open_transaction(url: str, table: str) -> None:
    with ProcQueue(1, store=url) as q:
        answers: list[object] = []
        with q.transaction() as tx:
            tx.push(Job("first", store_jobs.echo, args=(1,)))
            other = threading.Thread(target=lambda: answers.append(q.push(Job("first", store_jobs.echo, args=(1,)))))
            other.start()
            other.join(timeout=0.2)
            assert other.is_alive()  # it waits for the connection the transaction has
        other.join(timeout=WAIT)
        assert len(answers) == 1 and isinstance(answers[0], (InFlight, Cached))


def test_transaction_misuse_is_refused_clearly(url: str, tmp_path: Path) -> None:
    with ProcQueue(1) as plain, pytest.raises(ProcQueueError, match="needs a queue opened with a store"):
        plain.transaction()
    with ProcQueue(1, store=url) as q:
        tx = q.transaction()
        with pytest.raises(ProcQueueError, match="not open"):
            tx.push(Job("k", store_jobs.echo, args=(1,)))
        with tx, pytest.raises(ProcQueueError, match="do not nest"), q.transaction():
            pass
        with pytest.raises(ProcQueueError, match="used once"), tx:
            pass
        assert q.push_and_wait(Job("k", store_jobs.echo, args=(1,)), timeout=WAIT) == 1


# --- push(wake=True) across processes ----------------------------------------------


def test_wake_moves_the_not_before_of_a_key_another_process_holds(url: str, tmp_path: Path) -> None:
    log = tmp_path / "log"
    holder = subprocess.Popen(
        [sys.executable, PROGRAM, "later", url, "woken", str(log)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "claimed\n"  # pushed with not_before an hour away
        with ProcQueue(1, store=url) as q:
            plain = q.push(Job("woken", store_jobs.counted, args=(str(log), "ran")))
            assert isinstance(plain, InFlight)
            pushed = q.push(Job("woken", store_jobs.counted, args=(str(log), "ran")), wake=True)
            assert isinstance(pushed, InFlight)
            assert pushed.handle.result(timeout=WAIT) == "ran"
        assert holder.stdout.readline() == "ran\n"
        assert holder.wait(timeout=WAIT) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=WAIT)
        if holder.stdout is not None:
            holder.stdout.close()
    assert log.read_text().count("ran") == 1


# --- the store going away ------------------------------------------------------------


def test_a_postgresql_restart_loses_no_answer(own_pg_server: PgServer, tmp_path: Path) -> None:
    """The server stops while a job runs: pushes raise StoreUnavailable, the
    job finishes, its waiter is told once its outcome is written after the
    server is back, and the queue takes pushes again."""
    server = own_pg_server
    url = server.url()
    gate = Gate(tmp_path, "g")
    try:
        with ProcQueue(1, store=url) as q:
            running = q.push(Job("slow", jobs.signal_and_wait, args=(gate.started, gate.go)))
            assert isinstance(running, Queued)
            pid = gate.wait_started()
            server.stop()
            with pytest.raises(StoreUnavailable, match="cannot be used now"):
                q.push(Job("other", store_jobs.echo, args=(1,)))
            gate.open()
            wait_until(lambda: q._core.commits.refused_since is not None and q._core.commits.pending)
            assert not running.handle.done()  # ended, but not yet durable
            server.start()
            assert running.handle.result(timeout=WAIT) == pid
            assert q.push_and_wait(Job("other", store_jobs.echo, args=(1,)), timeout=WAIT) == 1
            assert q.state("slow") is not None and q.state("slow") == running.handle.state
        with ProcQueue(1, store=url) as again:
            assert again.push(Job("slow", jobs.signal_and_wait, args=(gate.started, gate.go))) == Cached(pid)
            assert again.push(Job("other", store_jobs.echo, args=(1,))) == Cached(1)
    finally:
        gate.close()


def test_an_unreachable_postgresql_store_is_refused_at_open(tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    with pytest.raises(StoreUnavailable, match="cannot be used now"):
        open_store(f"postgresql:///nothing?host={tmp_path}&user=postgres&connect_timeout=2").connect()


def test_a_failed_push_in_an_outage_leaves_the_key_free(own_pg_server: PgServer) -> None:
    url = own_pg_server.url()
    with ProcQueue(1, store=url) as q:
        own_pg_server.stop()
        for _ in range(3):
            with pytest.raises(StoreUnavailable):
                q.push(Job("k", store_jobs.echo, args=(1,)))
        own_pg_server.start()
        assert q.keys() == [] and q.state("k") is None
        assert q.push_and_wait(Job("k", store_jobs.echo, args=(1,)), timeout=WAIT) == 1
        state = q.state("k")
        assert not isinstance(state, Failed)


def test_closing_without_waiting_never_waits_for_the_store(tmp_path: Path) -> None:
    """A job ended while the store is locked: its outcome waits for the store,
    but ``close(wait=False)`` ends at once and gives it out unwritten."""
    db = tmp_path / "run.db"
    gate = Gate(tmp_path, "g")
    locker = sqlite3.connect(db, isolation_level=None)
    try:
        q = ProcQueue(1, store=SqliteStore(db, busy=0.1))
        try:
            running = q.push(Job("slow", jobs.signal_and_wait, args=(gate.started, gate.go)))
            assert isinstance(running, Queued)
            pid = gate.wait_started()
            locker.execute("BEGIN IMMEDIATE")
            gate.open()
            wait_until(lambda: q._core.commits.refused_since is not None and q._core.commits.pending)
            assert not running.handle.done()
            closer = threading.Thread(target=q.close, kwargs={"wait": False})
            closer.start()
            closer.join(timeout=WAIT)
            assert not closer.is_alive()
            assert running.handle.result(timeout=WAIT) == pid
        finally:
            q.close(wait=False)
    finally:
        with contextlib.suppress(sqlite3.Error):
            locker.execute("ROLLBACK")
        locker.close()
        gate.close()


def test_a_waiter_is_told_only_once_the_outcome_is_committed(url: str) -> None:
    """Whoever hears of an outcome can find it committed from any other
    connection at that moment."""
    with ProcQueue(2, store=url) as q:
        pushed = [q.push(Job(f"d{i}", store_jobs.echo, args=(i,))) for i in range(40)]
        for i, p in enumerate(pushed):
            assert isinstance(p, Queued)
            assert p.handle.result(timeout=WAIT) == i
            assert outside(url, f"SELECT state FROM procq_keys WHERE key = 'd{i}'") == [("done",)]


def test_a_waiter_is_told_only_once_the_outcome_is_committed_while_pushes_stream(url: str) -> None:
    """While pushes keep coming (the group transaction open, its claims and
    the outcomes queued together), a waiter in another thread still hears of
    an outcome only once it is committed."""
    import queue

    handles: queue.Queue[tuple[int, object] | None] = queue.Queue()
    early: list[tuple[int, object]] = []

    def wait_all() -> None:
        while (item := handles.get()) is not None:
            i, handle = item
            assert handle.result(timeout=WAIT) == i  # type: ignore[attr-defined]
            found = outside(url, f"SELECT state FROM procq_keys WHERE key = 's{i}'")
            if found != [("done",)]:
                early.append((i, found))

    with ProcQueue(2, store=url) as q:
        waiter = threading.Thread(target=wait_all)
        waiter.start()
        try:
            for i in range(300):
                pushed = q.push(Job(f"s{i}", store_jobs.echo, args=(i,)))
                assert isinstance(pushed, Queued)
                handles.put((i, pushed.handle))
        finally:
            handles.put(None)
            waiter.join(timeout=WAIT)
    assert not waiter.is_alive()
    assert early == []


def test_keys_of_a_dead_queue_on_this_machine_are_interrupted_without_waiting_for_its_lease(
    url: str, tmp_path: Path
) -> None:
    gate = Gate(tmp_path, "g")
    holder = subprocess.Popen([sys.executable, PROGRAM, "hold", url, "held", gate.started, gate.go, "3600"])
    try:
        gate.wait_started()
        with ProcQueue(1, store=url) as q:
            assert isinstance(q.push(Job("held", jobs.signal_and_wait, args=(gate.started, gate.go))), InFlight)
            holder.kill()
            holder.wait(timeout=WAIT)  # (reaped: its pid is gone)
            state = q.state("held")  # its lease has an hour to run
            assert isinstance(state, Failed) and state.failure.kind == "interrupted"
            again = q.push(
                Job("held", store_jobs.echo, args=(2,)),
            )
            assert isinstance(again, Queued) and again.handle.result(timeout=WAIT) == 2
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=WAIT)
        gate.open()
        gate.close()
