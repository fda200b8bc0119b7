"""Large outputs in a SQLite store: written in pieces before their rows, each
piece a transaction of its own (``procq._stores.sqlite_spill``), so that other
jobs' claims and answers never wait for a large output's write; read whole by
every reader; their pieces deleted once no row needs them."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import store_jobs
from core_support import WAIT

from procq import (
    Cached,
    Completed,
    Job,
    JobPicklingError,
    Lane,
    ProcQueue,
    Queued,
    SqliteStore,
    StoreError,
    StoreUnavailable,
)
from procq._durable.outputs import Outputs
from procq._stores import sqlite_spill
from procq._stores.sqlite import SqliteConn

MIB = 1 << 20
SIZE = 3 * MIB + 5  # pickled: four pieces of a MiB


def big_job(key: str = "big", **kw: object) -> Job[bytes]:
    return Job(key, store_jobs.sized, args=(SIZE,), **kw)  # type: ignore[arg-type]


def pieces_of(db: Path) -> int:
    with sqlite3.connect(db) as con:
        return int(con.execute("SELECT count(*) FROM procq_pieces").fetchone()[0])


def drop_orphans(db: Path) -> int:
    conn = SqliteStore(db).connect()
    try:
        return conn.drop_orphans()
    finally:
        conn.close()


def test_a_large_output_is_written_in_pieces_and_read_whole_everywhere(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    expected = store_jobs.sized(SIZE)
    with ProcQueue(1, store=str(db)) as q:
        assert q.push_and_wait(big_job(), timeout=WAIT) == expected
        assert q.push(big_job()) == Cached(expected)
        assert q.state("big") == Completed(expected)
        assert [h.result(timeout=0) for h in q.handles()] == [expected]
        small = q.push_and_wait(Job("small", store_jobs.sized, args=(100,)), timeout=WAIT)
    with sqlite3.connect(db) as con:
        rows = dict(con.execute("SELECT key, encoding FROM procq_keys").fetchall())
        stub = con.execute("SELECT output FROM procq_keys WHERE key = 'big'").fetchone()[0]
        schema = con.execute("SELECT value FROM procq_meta WHERE name = 'schema'").fetchone()[0]
    assert rows == {"big": "pieces:pickle", "small": "pickle"} and len(stub) < 32
    assert pieces_of(db) == 4 and schema == "2"
    with ProcQueue(1, store=str(db)) as q:  # another queue, later
        assert q.push(big_job()) == Cached(expected)
        assert q.push(Job("small", store_jobs.sized, args=(100,))) == Cached(small)
    assert drop_orphans(db) == 0 and pieces_of(db) == 4


def test_pieces_go_once_no_row_needs_them(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    with ProcQueue(1, store=str(db)) as q:
        q.push_and_wait(big_job("a"), timeout=WAIT)
        q.push_and_wait(big_job("b"), timeout=WAIT)
        assert q.forget("a")
    assert pieces_of(db) == 8
    assert drop_orphans(db) == 4 and pieces_of(db) == 4
    with ProcQueue(1, store=str(db)) as q:  # run again: the new run's pieces replace the old
        assert type(q.push(big_job("b", reuse="always"))) is Queued
        assert q.push_and_wait(big_job("b"), timeout=WAIT) == store_jobs.sized(SIZE)
    assert drop_orphans(db) == 4 and pieces_of(db) == 4


def test_an_abandoned_claim_puts_back_the_spilled_output_it_replaced(tmp_path: Path) -> None:
    # A push that runs a completed key again (reuse="always") replaces its
    # row; when the push fails (its argument cannot be pickled), the row it
    # replaced comes back, and so does its output, read whole.
    db = tmp_path / "run.db"
    expected = store_jobs.sized(SIZE)
    with ProcQueue(1, store=str(db)) as q:
        q.push_and_wait(big_job(), timeout=WAIT)
        with pytest.raises(JobPicklingError):
            q.push(Job("big", store_jobs.sized, args=(threading.Lock(),), reuse="always"))
        assert q.push(big_job()) == Cached(expected)
    drop_orphans(db)
    with ProcQueue(1, store=str(db)) as q:
        assert q.push(big_job()) == Cached(expected)


def test_an_output_with_a_piece_missing_is_refused_by_name(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    with ProcQueue(1, store=str(db)) as q:
        q.push_and_wait(big_job(), timeout=WAIT)
    with sqlite3.connect(db) as con:
        con.execute("DELETE FROM procq_pieces WHERE seq = 2")
    with ProcQueue(1, store=str(db)) as q:
        with pytest.raises(StoreError, match=r"output of key 'big' is incomplete \(3 of 4 pieces.*q\.forget"):
            q.state("big")
        assert q.forget("big")
        assert q.push_and_wait(big_job(), timeout=WAIT) == store_jobs.sized(SIZE)


@pytest.mark.parametrize(
    "where, error",
    [(SqliteConn, StoreUnavailable("the disk is full (a test's)")), (Outputs, RuntimeError("a bug (a test's)"))],
    ids=["the store refuses", "a bug"],
)
def test_a_spill_that_fails_writes_the_row_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: type, error: Exception
) -> None:
    # Readying an output runs on the lane's decode thread, which must end the
    # job whatever goes wrong there: the output is then written with its row.
    def fail(*args: object) -> None:
        raise error

    monkeypatch.setattr(where, "spill" if where is SqliteConn else "_spill", fail)
    db = tmp_path / "run.db"
    with ProcQueue(1, store=str(db)) as q:
        assert q.push_and_wait(big_job(), timeout=WAIT) == store_jobs.sized(SIZE)
        assert q.push_and_wait(Job("after", store_jobs.echo, args=(1,)), timeout=WAIT) == 1
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT encoding FROM procq_keys ORDER BY key").fetchall() == [("pickle",), ("pickle",)]
    assert pieces_of(db) == 0


@pytest.fixture
def held_spill(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Every spill stops after its first piece until the test lets it go on."""
    first, go = threading.Event(), threading.Event()
    cut = sqlite_spill.pieces

    def pieces(output: bytes) -> Iterator[memoryview]:
        parts = cut(output)
        yield parts[0]
        first.set()
        assert go.wait(WAIT), "the test never let the spill go on"
        yield from parts[1:]

    monkeypatch.setattr(sqlite_spill, "pieces", pieces)
    yield first, go
    go.set()


def test_other_jobs_are_answered_while_a_large_output_is_written(
    tmp_path: Path, held_spill: tuple[threading.Event, threading.Event]
) -> None:
    # The canary's claim, its outcome's commit and its answer never wait for
    # the large output's write: here that write is stopped half-way, and the
    # canary is answered, again and again, while it is.
    first, go = held_spill
    lanes = {"big": Lane(workers=1), "canary": Lane(workers=1)}
    with ProcQueue(lanes, store=str(tmp_path / "run.db")) as q:
        big = q.push(big_job(lane="big")).handle  # type: ignore[union-attr]
        assert first.wait(WAIT)
        for i in range(5):
            assert q.push_and_wait(Job(f"canary{i}", store_jobs.echo, args=(i,), lane="canary"), timeout=WAIT) == i
        assert not big.done() and q.state("canary4") == Completed(4)
        go.set()
        assert big.result(timeout=WAIT) == store_jobs.sized(SIZE)
