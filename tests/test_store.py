"""Keys that outlive the program: queues sharing a store (SQLite, PostgreSQL).

Every test runs on a real database: a SQLite file in the test's directory, and
a throwaway PostgreSQL server (``pg_server``) when its binaries are here.
Programs that must die or race run as processes of their own
(``store_program.py``)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jobs
import psutil
import pytest
import store_jobs
from core_support import WAIT, Gate, wait_until
from pg_server import pg_url
from process_support import linux_only, subreaper

from procq import (
    Cached,
    Completed,
    Failed,
    InFlight,
    Job,
    JobFailed,
    JobPicklingError,
    KeyConflict,
    Lane,
    Pending,
    Processing,
    ProcQueue,
    QueueClosed,
    Queued,
    Retention,
    SqliteStore,
    StoreError,
    StoreUnavailable,
)
from procq._durable.records import sweep_rows
from procq._stores.urls import open_store

PROGRAM = str(Path(__file__).with_name("store_program.py"))


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, PROGRAM, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def program() -> Iterator[list[subprocess.Popen[str]]]:
    """Programs started in the background; any still running at the end are killed and reaped."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=WAIT)


def start(started: list[subprocess.Popen[str]], *args: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, PROGRAM, *args], text=True)
    started.append(p)
    return p


# --- one program, restarted ----------------------------------------------------------


def test_completed_keys_answer_cached_across_restarts(url: str, tmp_path: Path) -> None:
    log = tmp_path / "log"
    with ProcQueue(1, store=url) as q:
        assert q.push_and_wait(Job("a", store_jobs.counted, args=(str(log), {"x": [1, 2]})), timeout=WAIT) == {
            "x": [1, 2]
        }
        with pytest.raises(JobFailed):
            q.push_and_wait(Job("b", store_jobs.fails, args=(str(log),)), timeout=WAIT)
    with ProcQueue(1, store=url) as q:
        assert q.push(Job("a", store_jobs.counted, args=(str(log), {"x": [1, 2]}))) == Cached({"x": [1, 2]})
        assert q.state("a") == Completed({"x": [1, 2]})
        failed = q.state("b")
        assert isinstance(failed, Failed) and failed.failure.kind == "error"
        assert "this job fails" in failed.failure.message
        assert q.keys() == ["a", "b"]
        assert q.keys(state=Completed) == ["a"]
        assert [h.state for h in q.handles(prefix="a")] == [Completed({"x": [1, 2]})]
        assert q.stats().completed == 1 and q.stats().failed == 1
        # reuse="failed" (the default): a failed key runs again; "never": it answers its failure.
        never = q.push(Job("b", store_jobs.fails, args=(str(log),), reuse="never"))
        assert isinstance(never, InFlight) and isinstance(never.handle.state, Failed)
        again = q.push(Job("b", store_jobs.fails, args=(str(log),)))
        assert isinstance(again, Queued)
        with pytest.raises(JobFailed):
            again.handle.result(timeout=WAIT)
        # reuse="always": a completed key runs again.
        fresh = q.push(Job("a", store_jobs.counted, args=(str(log), {"x": [1, 2]}), reuse="always"))
        assert isinstance(fresh, Queued) and fresh.handle.result(timeout=WAIT) == {"x": [1, 2]}
        assert q.forget("a") and q.state("a") is None and not q.forget("a")
    assert [line.split()[0] for line in lines(log)] == ["{'x':", "fails", "fails", "{'x':"]


def test_another_payload_under_a_stored_key_conflicts(url: str, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    with ProcQueue(1, store=url) as q:
        q.push_and_wait(Job("k", store_jobs.counted, args=(log, 1)), timeout=WAIT)
    with ProcQueue(1, store=url) as q:
        assert q.push(Job("k", store_jobs.counted, args=(log, 1))) == Cached(1)
        with pytest.raises(ValueError, match="other arguments"):
            q.push(Job("k", store_jobs.counted, args=(log, 2)))


def test_a_key_live_in_this_queue_is_checked_against_its_payload(url: str, tmp_path: Path) -> None:
    gate = Gate(tmp_path, "k")
    with ProcQueue(1, store=url) as q:
        try:
            held = q.push(Job("k", jobs.signal_and_wait, args=(gate.started, gate.go)))
            assert isinstance(held, Queued)
            gate.wait_started()
            joined = q.push(Job("k", jobs.signal_and_wait, args=(gate.started, gate.go)))
            assert isinstance(joined, InFlight)
            with pytest.raises(KeyConflict, match="other arguments"):
                q.push(Job("k", jobs.signal_and_wait, args=(gate.started, gate.go + "x")))
            assert q.state("k") == Processing()
            gate.open()
            pid = held.handle.result(timeout=WAIT)
            assert joined.handle.result(timeout=WAIT) == pid
        finally:
            gate.close()


def test_untrusted_lanes_store_json(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    with ProcQueue({"u": Lane(1, trusted=False)}, store=str(db)) as q:
        assert q.push_and_wait(Job("u", store_jobs.echo, args=([1, "two"],)), timeout=WAIT) == [1, "two"]
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT encoding, output FROM procq_keys").fetchall() == [("json", b'[1, "two"]')]
    with ProcQueue({"u": Lane(1, trusted=False)}, store=str(db)) as q:
        assert q.push(Job("u", store_jobs.echo, args=([1, "two"],))) == Cached([1, "two"])


def test_an_abandoned_claim_leaves_no_row(url: str) -> None:
    with ProcQueue(1, store=url) as q:
        with pytest.raises(JobPicklingError):
            q.push(Job("bad", store_jobs.echo, args=(threading.Lock(),)))
        assert q.state("bad") is None and q.keys() == []
        assert q.push_and_wait(Job("bad", store_jobs.echo, args=(3,)), timeout=WAIT) == 3


def test_push_all_claims_in_one_transaction(url: str, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    with ProcQueue(2, store=url) as q:
        q.push_and_wait(Job("k1", store_jobs.counted, args=(log, 1)), timeout=WAIT)
        out = q.push_all([Job(f"k{i}", store_jobs.counted, args=(log, i)) for i in (1, 2, 3, 2)])
        assert out[0] == Cached(1)
        assert isinstance(out[1], Queued) and isinstance(out[2], Queued) and isinstance(out[3], InFlight)
        assert [o.handle.result(timeout=WAIT) for o in out[1:]] == [2, 3, 2]
    assert sorted(line.split()[0] for line in lines(Path(log))) == ["1", "2", "3"]


def test_push_all_answers_every_kind_of_row_and_a_refused_batch_leaves_none(url: str, tmp_path: Path) -> None:
    """One batch over keys completed, failed, live in another queue, new and
    repeated; then a batch refused for a payload conflict claims none of its keys."""
    log = str(tmp_path / "log")
    gate = Gate(tmp_path, "g")
    try:
        with ProcQueue(1, store=url) as other, ProcQueue(2, store=url) as q:
            held = other.push(Job("held", jobs.signal_and_wait, args=(gate.started, gate.go)))
            pid = gate.wait_started()
            q.push_and_wait(Job("done", store_jobs.counted, args=(log, "done")), timeout=WAIT)
            with pytest.raises(JobFailed):
                q.push_and_wait(Job("failed", store_jobs.fails, args=(log,)), timeout=WAIT)
            batch = [
                Job("done", store_jobs.counted, args=(log, "done")),
                Job("failed", store_jobs.counted, args=(log, "failed again")),
                Job("held", jobs.signal_and_wait, args=(gate.started, gate.go)),
                Job("new", store_jobs.counted, args=(log, "new")),
                Job("new", store_jobs.counted, args=(log, "new")),
            ]
            out = q.push_all(batch)
            assert out[0] == Cached("done")
            assert isinstance(out[1], Queued) and out[1].handle.result(timeout=WAIT) == "failed again"
            assert isinstance(out[2], InFlight) and isinstance(out[3], Queued) and isinstance(out[4], InFlight)
            assert out[3].handle.result(timeout=WAIT) == out[4].handle.result(timeout=WAIT) == "new"
            gate.open()
            assert out[2].handle.result(timeout=WAIT) == pid == held.handle.result(timeout=WAIT)

            refused = [Job(f"fresh{i}", store_jobs.echo, args=(i,)) for i in range(3)]
            refused.insert(2, Job("done", store_jobs.echo, args=("another payload",)))
            with pytest.raises(KeyConflict):
                q.push_all(refused)
            assert [q.state(f"fresh{i}") for i in range(3)] == [None, None, None]
            assert outside_count(url, "fresh%") == 0
            assert q.push_all([Job("fresh0", store_jobs.echo, args=(0,))])[0].handle.result(timeout=WAIT) == 0
    finally:
        gate.close()
    assert sorted(line.split()[0] for line in lines(Path(log))) == ["done", "failed", "fails", "new"]


def test_a_batch_cut_short_leaves_none_of_its_claims(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch that fails part-way (here the queue's state map refusing its
    second key, as it does once the queue begins closing, which a store's
    batch can meet between two keys) claims none of its keys: they can be
    pushed again and run, and the queue closes."""
    with ProcQueue(1, store=url) as q:
        state_map = type(q._core.keys)
        claim = state_map.claim
        calls = []

        def refuse_the_second(self: Any, *args: Any) -> Any:
            calls.append(args)
            if len(calls) == 2:
                raise QueueClosed("the queue is closed")
            return claim(self, *args)

        monkeypatch.setattr(state_map, "claim", refuse_the_second)
        with pytest.raises(QueueClosed):
            q.push_all([Job(f"cut{i}", store_jobs.echo, args=(i,)) for i in range(3)])
        monkeypatch.undo()
        q._core.deliver_now(q._core.commit())
        assert outside_count(url, "cut%") == 0
        assert [q.state(f"cut{i}") for i in range(3)] == [None, None, None]
        out = q.push_all([Job(f"cut{i}", store_jobs.echo, args=(i,)) for i in range(3)])
        assert [o.handle.result(timeout=WAIT) for o in out] == [0, 1, 2]


def outside_count(url: str, like: str) -> int:
    """Rows whose key is LIKE ``like``, read on a connection of the test's own."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url[len("sqlite:///") :]) as con:
            return int(con.execute("SELECT count(*) FROM procq_keys WHERE key LIKE ?", (like,)).fetchone()[0])
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        found = con.execute("SELECT count(*) FROM procq_keys WHERE key LIKE %s", (like,)).fetchone()
        return int(found[0]) if found else 0


# --- the store's file and URL ------------------------------------------------------------


def test_store_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert isinstance(open_store("run.db"), SqliteStore)
    assert open_store("sqlite:///rel.db").path == "rel.db"  # type: ignore[attr-defined]
    assert open_store(f"sqlite:///{tmp_path}/abs.db").path == f"{tmp_path}/abs.db"  # type: ignore[attr-defined]
    with pytest.raises(StoreError, match="URL schemes"):
        open_store("mysql://x")
    with pytest.raises(TypeError, match="store must be"):
        open_store(3)  # type: ignore[arg-type]
    with ProcQueue(1, store=SqliteStore(tmp_path / "obj.db", lease=5)) as q:
        assert q.push_and_wait(Job("k", store_jobs.echo, args=(1,)), timeout=WAIT) == 1
    with ProcQueue(1, store=tmp_path / "obj.db") as q:
        assert q.push(Job("k", store_jobs.echo, args=(1,))) == Cached(1)


def test_a_store_from_a_newer_procq_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    ProcQueue(1, store=str(db)).close()
    with sqlite3.connect(db) as con:
        con.execute("UPDATE procq_meta SET value = '99' WHERE name = 'schema'")
    with pytest.raises(StoreError, match=r"written by a newer procq \(schema 99\).*upgrade procq"):
        ProcQueue(1, store=str(db))


# --- queues in several processes -------------------------------------------------------------


def test_processes_and_threads_racing_one_key_run_it_once(url: str, tmp_path: Path) -> None:
    log = tmp_path / "log"
    outs = [tmp_path / f"out{i}" for i in range(3)]
    procs = [subprocess.Popen([sys.executable, PROGRAM, "race", url, "raced", str(log), "4", str(out)]) for out in outs]
    try:
        for p in procs:
            assert p.wait(timeout=50) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    answers = [a for out in outs for a in json.loads(out.read_text())]
    assert answers == ["the value"] * 12
    assert len(lines(log)) == 1


def test_a_key_live_in_another_queue_is_joined(url: str, tmp_path: Path, program: list[subprocess.Popen[str]]) -> None:
    gate = Gate(tmp_path, "g")
    try:
        holder = start(program, "hold", url, "held", gate.started, gate.go, "10")
        pid = gate.wait_started()
        with ProcQueue(1, store=url) as q:
            pushed = q.push(Job("held", jobs.signal_and_wait, args=(gate.started, gate.go)))
            assert isinstance(pushed, InFlight)
            assert q.state("held") == Processing() and pushed.handle.state == Processing()
            assert q.keys(state=Processing) == ["held"]
            with pytest.raises(ValueError, match="live in another queue"):
                q.forget("held")
            gate.open()
            assert pushed.handle.result(timeout=WAIT) == pid
            assert q.state("held") == Completed(pid)
        assert holder.wait(timeout=WAIT) == 0
    finally:
        gate.close()


@pytest.mark.skipif(not linux_only, reason="a subreaper (prctl) is Linux-only")
def test_a_killed_queues_keys_are_interrupted_and_run_again(
    url: str, tmp_path: Path, program: list[subprocess.Popen[str]]
) -> None:
    gate = Gate(tmp_path, "g")
    with subreaper():
        try:
            holder = start(program, "hold", url, "held", gate.started, gate.go, "0.5")
            orphan = psutil.Process(gate.wait_started())
            with ProcQueue(1, store=url) as q:
                first = q.push(Job("held", jobs.signal_and_wait, args=(gate.started, gate.go)))
                assert isinstance(first, InFlight)
                descendants = psutil.Process(holder.pid).children(recursive=True)
                assert orphan.pid in [p.pid for p in descendants]
                os.kill(holder.pid, signal.SIGKILL)
                holder.wait(timeout=WAIT)
                with pytest.raises(JobFailed) as info:
                    first.handle.result(timeout=WAIT)
                assert info.value.failure.kind == "interrupted"
                state = q.state("held")
                assert isinstance(state, Failed) and state.failure.kind == "interrupted"
                again = q.push(Job("held", jobs.signal_and_wait, args=(gate.started, gate.go)))
                assert isinstance(again, Queued)
                pid = int(jobs.wait_signal(gate.started, WAIT))
                assert pid != orphan.pid
                gate.open()
                assert again.handle.result(timeout=WAIT) == pid
            # The killed queue's processes (its worker, let go by the gate) end on their own.
            _, alive = psutil.wait_procs(descendants, timeout=WAIT)
            assert not alive
        finally:
            gate.close()


def test_a_stage_rerun_after_a_crash_skips_completed_keys(url: str, tmp_path: Path) -> None:
    log = tmp_path / "log"
    crashed = run("stage", url, str(log), "6", "2")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert [line.split()[0] for line in lines(log)] == ["0", "1", "2"]
    finished = run("stage", url, str(log), "6", "-1")
    assert finished.returncode == 0, finished.stderr
    assert [line.split()[0] for line in lines(log)] == ["0", "1", "2", "3", "4", "5"]
    with ProcQueue(1, store=url) as q:
        assert q.keys(state=Completed) == [f"stage:{i}" for i in range(6)]


@pytest.mark.skipif(not linux_only, reason="a subreaper (prctl) is Linux-only")
def test_queues_in_separate_processes_survive_one_killed(
    url: str, tmp_path: Path, program: list[subprocess.Popen[str]]
) -> None:
    """Three programs share the keys; the first claims them all and is SIGKILLed
    mid-run: the other two take over its keys once its lease expires, and every
    key completes, none lost or stuck."""
    log = str(tmp_path / "log")
    args = ("work", url, log, "12", "0.2", "0.5")
    with subreaper():
        first = subprocess.Popen([sys.executable, PROGRAM, *args], stdout=subprocess.PIPE, text=True)
        program.append(first)
        assert first.stdout is not None
        assert first.stdout.readline() == "claimed\n"
        descendants = psutil.Process(first.pid).children(recursive=True)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=WAIT)
        first.stdout.close()
        others = [subprocess.Popen([sys.executable, PROGRAM, *args], stdout=subprocess.PIPE, text=True) for _ in "ab"]
        program.extend(others)
        for p in others:
            out, _ = p.communicate(timeout=50)
            assert p.returncode == 0
            assert json.loads(out.splitlines()[-1]) == {str(i): i for i in range(12)}
        _, alive = psutil.wait_procs(descendants, timeout=WAIT)
        assert not alive
    with ProcQueue(1, store=url) as q:
        assert q.keys(state=Completed) == sorted(f"work:{i}" for i in range(12))
        assert q.keys(state=(Pending, Processing, Failed)) == []
    ran = [int(line.split()[0]) for line in lines(Path(log))]
    assert set(ran) == set(range(12))


def test_a_postgresql_store_from_a_newer_procq_is_refused(request: pytest.FixtureRequest) -> None:
    url = pg_url(request)
    ProcQueue(1, store=url).close()
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        con.execute("UPDATE procq_meta SET value = '99' WHERE name = 'schema'")
    with pytest.raises(StoreError, match=r"written by a newer procq \(schema 99\).*upgrade procq"):
        ProcQueue(1, store=url)


def test_a_locked_store_refuses_pushes_and_gets_outcomes_once_back(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    gate = Gate(tmp_path, "g")
    try:
        with ProcQueue(1, store=SqliteStore(db, lease=1.0, busy=0.1)) as q:
            running = q.push(Job("slow", jobs.signal_and_wait, args=(gate.started, gate.go)))
            assert isinstance(running, Queued)
            pid = gate.wait_started()
            locker = sqlite3.connect(db, isolation_level=None)
            locker.execute("BEGIN IMMEDIATE")
            try:
                with pytest.raises(StoreUnavailable, match="cannot be used now: database is locked"):
                    q.push(Job("other", store_jobs.echo, args=(1,)))
                gate.open()
                # The job ends, but its waiter is told only once its outcome is durable.
                wait_until(lambda: q._core.commits.refused_since is not None and q._core.commits.pending)
                assert not running.handle.done()
            finally:
                locker.execute("ROLLBACK")
                locker.close()
            assert running.handle.result(timeout=WAIT) == pid  # written once the store is back
            assert q.state("other") is None
            # Its outcome is written once the store is back: another queue gets it.
            with ProcQueue(1, store=SqliteStore(db)) as other:
                pushed = other.push(Job("slow", jobs.signal_and_wait, args=(gate.started, gate.go)))
                output = pushed.output if isinstance(pushed, Cached) else pushed.handle.result(timeout=WAIT)
                assert output == pid
    finally:
        gate.close()


class _FullStore(SqliteStore):
    """A SQLite store whose file cannot grow while ``full`` (SQLite's own
    ``max_page_count``: a statement that needs a new page fails with
    "database or disk is full", as on a full disk)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, busy=0.1)
        self.conns: list[Any] = []

    def connect(self) -> Any:
        conn = super().connect()
        self.conns.append(conn)
        return conn

    def set_full(self, core: Any, full: bool) -> None:
        with core.db_lock:  # (the queue's connection is the queue's to use)
            for conn in self.conns:
                pages = conn.db.execute("PRAGMA page_count").fetchone()[0] if full else 2**30
                conn.db.execute(f"PRAGMA max_page_count = {pages}")


def test_a_full_store_refuses_pushes_and_gets_outcomes_once_it_has_room(tmp_path: Path) -> None:
    store = _FullStore(tmp_path / "run.db")
    gate = Gate(tmp_path, "g")
    try:
        with ProcQueue(1, store=store) as q:
            running = q.push(Job("big", store_jobs.big, args=(gate.started, gate.go, 100_000)))
            assert isinstance(running, Queued)
            gate.wait_started()
            store.set_full(q._core, True)
            gate.open()
            # The job ends; its outcome cannot be written, so its waiter waits.
            wait_until(lambda: q._core.commits.refused_since is not None and q._core.commits.pending)
            assert not running.handle.done()
            with pytest.raises(StoreUnavailable, match="database or disk is full"):
                q.push(Job("other", store_jobs.echo, args=(1,)))
            assert q.state("other") is None
            store.set_full(q._core, False)
            assert running.handle.result(timeout=WAIT) == b"x" * 100_000  # written once there is room
            assert q.push_and_wait(Job("other", store_jobs.echo, args=(1,)), timeout=WAIT) == 1
        with ProcQueue(1, store=SqliteStore(tmp_path / "run.db")) as again:
            assert again.push(Job("big", store_jobs.big, args=(gate.started, gate.go, 100_000))) == Cached(
                b"x" * 100_000
            )
            assert again.push(Job("other", store_jobs.echo, args=(1,))) == Cached(1)
    finally:
        gate.close()


def test_retention_deletes_rows(url: str, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    with ProcQueue(1, store=url, retention=Retention(max_completed=2)) as q:
        for i in range(4):
            q.push_and_wait(Job(f"k{i}", store_jobs.counted, args=(log, i)), timeout=WAIT)
        assert q._store is not None and sweep_rows(q._store) == 2
        assert q.keys() == ["k2", "k3"]
        assert isinstance(q.push(Job("k0", store_jobs.counted, args=(log, 0))), Queued)
    # ttl=0: every completed row is past its time at once; it is neither answered nor listed, and is deleted.
    with ProcQueue(1, store=url, retention=Retention(ttl=0.0)) as q:
        assert isinstance(q.push(Job("k3", store_jobs.counted, args=(log, 3))), Queued)
        q.push_and_wait(Job("k3", store_jobs.counted, args=(log, 3)), timeout=WAIT)
        assert q.state("k3") is None and q.keys() == []
        assert q._store is not None and sweep_rows(q._store) >= 1


@pytest.mark.parametrize("retention", [Retention(max_completed=3), Retention(ttl=0.0, failed_ttl=0.0)])
def test_sqlite_sweeps_and_counts_search_the_ended_rows_never_the_whole_table(
    tmp_path: Path, retention: Retention
) -> None:
    """What q.stats() counts and what a retention sweep deletes are found
    through the index of ended rows: their cost follows the rows they touch,
    not how many the table holds (a scan of the table, its outputs
    included, stalled pushes for a second at a million rows)."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    log = str(tmp_path / "log")
    with ProcQueue(1, store=url, retention=retention) as q:
        for i in range(6):
            q.push_and_wait(Job(f"k{i}", store_jobs.counted, args=(log, i)), timeout=WAIT)
        ran: list[str] = []
        assert q._store is not None
        db = q._store.conn.db  # type: ignore[attr-defined]
        db.set_trace_callback(ran.append)
        try:
            q.stats()
            deleted = sweep_rows(q._store)
        finally:
            db.set_trace_callback(None)
        assert deleted == (3 if retention.max_completed else 6)
        asked = [sql for sql in ran if "procq_keys" in sql and sql.lstrip().upper().startswith(("SELECT", "DELETE"))]
        assert any("count(" in sql for sql in asked) and any(sql.lstrip().startswith("DELETE") for sql in asked), ran
        with sqlite3.connect(tmp_path / "store.db") as check:
            for sql in asked:
                plan = " / ".join(row[-1] for row in check.execute(f"EXPLAIN QUERY PLAN {sql}"))
                assert "SCAN procq_keys" not in plan, (sql, plan)


def test_close_does_not_wait_for_the_leases_next_renewal(url: str) -> None:
    """The queue's watcher waits for the store between lease renewals (a
    third of the lease; on PostgreSQL, for a notification): closing the
    queue ends that wait at once. With a 60 s lease, close() returned only at
    the next renewal, up to 20 s later."""
    import time

    from procq import PostgresStore, SqliteStore

    store = (
        SqliteStore(url.removeprefix("sqlite:///"), lease=60)
        if url.startswith("sqlite")
        else PostgresStore(url, lease=60)
    )
    q = ProcQueue(1, store=store)
    try:
        assert q.push_and_wait(Job("k", store_jobs.echo, args=(1,)), timeout=WAIT) == 1
    finally:
        began = time.monotonic()
        q.close()
        took = time.monotonic() - began
    assert took < 5, f"close() took {took:.1f} s"
