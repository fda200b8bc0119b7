"""The SQLite store: one file, shared by the queues of one machine.

The standard library's ``sqlite3``, in WAL mode (readers never wait for the
writer) with ``synchronous=NORMAL``: a committed write survives the death of
any process (SIGKILL included), though not a power cut. A claim is one
``BEGIN IMMEDIATE`` transaction: SQLite's single write lock is what makes it
atomic across processes. SQLite cannot tell a joiner that a row changed, so a
joiner of another queue's key polls its row (``Store.poll``, 10 ms).
"""

from __future__ import annotations

import os
import socket
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from procq._store import COLUMNS, SCHEMA, Row, Store, StoreError, StoreUnavailable

__all__ = ["SqliteStore"]

_BATCH = 500  # rows a retention sweep deletes per transaction

_DDL = [
    """CREATE TABLE IF NOT EXISTS procq_keys (
        key TEXT PRIMARY KEY, state TEXT NOT NULL, run TEXT NOT NULL, holder TEXT, fp BLOB,
        output BLOB, encoding TEXT, failure TEXT, attempts INTEGER NOT NULL DEFAULT 1,
        not_before REAL, created REAL NOT NULL, ended REAL)""",
    "CREATE INDEX IF NOT EXISTS procq_keys_live ON procq_keys (holder) WHERE state = 'live'",
    "CREATE TABLE IF NOT EXISTS procq_holders (id TEXT PRIMARY KEY, pid INTEGER, host TEXT, expires REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS procq_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
]


class SqliteStore(Store):
    """A SQLite file as a store (``ProcQueue(store="run.db")``)."""

    def __init__(
        self, path: str | os.PathLike[str], lease: float = 10.0, poll: float = 0.01, busy: float = 30.0
    ) -> None:
        super().__init__(lease, poll)
        self.path = os.fspath(path)
        self.url = f"sqlite:///{self.path}"
        self.busy = busy  # how long a write waits for another process's write lock before StoreUnavailable

    def connect(self) -> SqliteConn:
        return SqliteConn(self.path, self.busy)


def _unavailable(path: str, exc: Exception) -> StoreUnavailable:
    return StoreUnavailable(f"the SQLite store {path!r} cannot be used now: {exc}")


class SqliteConn:
    """One connection to a SQLite store (see ``_store.Conn``)."""

    def __init__(self, path: str, busy: float = 30.0) -> None:
        self.path = path
        try:
            db = sqlite3.connect(path, timeout=busy, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            raise _unavailable(path, exc) from exc
        self.db = db
        try:
            with self._tx():
                for ddl in _DDL:
                    db.execute(ddl)
                found = db.execute("SELECT value FROM procq_meta WHERE name = 'schema'").fetchone()
                if found is None:
                    db.execute("INSERT INTO procq_meta VALUES ('schema', ?)", (str(SCHEMA),))
                elif int(found[0]) > SCHEMA:
                    raise StoreError(
                        f"the store {path!r} was written by a newer procq (schema {found[0]}); this procq reads "
                        f"schema {SCHEMA} and older: upgrade procq to use it"
                    )
        except BaseException:
            self.db.close()
            raise

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        db = self.db
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise _unavailable(self.path, exc) from exc
        try:
            yield db
        except BaseException:
            with suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise
        try:
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            with suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise _unavailable(self.path, exc) from exc

    @contextmanager
    def write(self, keys: list[str]) -> Iterator[SqliteTx]:
        # SQLite has one write lock for the whole file: holding it holds every key.
        with self._tx() as db:
            try:
                yield SqliteTx(db)
            except sqlite3.Error as exc:
                raise _unavailable(self.path, exc) from exc

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        try:
            return self.db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise _unavailable(self.path, exc) from exc

    def read(self, key: str) -> Row | None:
        found = self._query(f"SELECT {COLUMNS} FROM procq_keys WHERE key = ?", (key,))
        return Row(*found[0]) if found else None

    def rows(self, keys: list[str]) -> dict[str, Row]:
        marks = ",".join("?" * len(keys))
        sql = f"SELECT {COLUMNS} FROM procq_keys WHERE key IN ({marks})"
        return {r[0]: Row(*r) for r in self._query(sql, tuple(keys))}

    def scan(self, prefix: str | None) -> list[Row]:
        if prefix is None:
            return [Row(*r) for r in self._query(f"SELECT {COLUMNS} FROM procq_keys")]
        # substr, not LIKE: a prefix may hold % and _.
        sql = f"SELECT {COLUMNS} FROM procq_keys WHERE substr(key, 1, ?) = ?"
        return [Row(*r) for r in self._query(sql, (len(prefix), prefix))]

    def dead_holders(self) -> set[str]:
        sql = (
            "SELECT DISTINCT k.holder FROM procq_keys k LEFT JOIN procq_holders h ON h.id = k.holder "
            "WHERE k.state = 'live' AND (h.id IS NULL OR h.expires < ?)"
        )
        return {r[0] for r in self._query(sql, (time.time(),))}

    def counts(self) -> tuple[int, int]:
        found = dict(self._query("SELECT state, count(*) FROM procq_keys WHERE state != 'live' GROUP BY state"))
        return found.get("done", 0), found.get("failed", 0)

    def renew(self, holder: str, lease: float) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO procq_holders VALUES (?, ?, ?, ?)",
                (holder, os.getpid(), socket.gethostname(), time.time() + lease),
            )

    def purge(self, ttl: float | None, failed_ttl: float | None, max_completed: int | None) -> int:
        # Short transactions of at most _BATCH rows each: a sweep never holds the write lock for long.
        deleted = 0
        now = time.time()
        wheres: list[tuple[str, tuple[Any, ...]]] = []
        if ttl is not None:
            wheres.append(("state = 'done' AND ended <= ?", (now - ttl,)))
        if failed_ttl is not None:
            wheres.append(("state = 'failed' AND ended <= ?", (now - failed_ttl,)))
        for where, args in wheres:
            while True:
                with self._tx() as db:
                    sql = f"DELETE FROM procq_keys WHERE key IN (SELECT key FROM procq_keys WHERE {where} LIMIT ?)"
                    n = db.execute(sql, (*args, _BATCH)).rowcount
                deleted += n
                if n < _BATCH:
                    break
        if max_completed is not None:
            while True:
                with self._tx() as db:
                    sql = (
                        "DELETE FROM procq_keys WHERE key IN (SELECT key FROM procq_keys WHERE state = 'done' "
                        "ORDER BY ended DESC LIMIT ? OFFSET ?)"
                    )
                    n = db.execute(sql, (_BATCH, max_completed)).rowcount
                deleted += n
                if n < _BATCH:
                    break
        return deleted

    def release(self, holder: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM procq_holders WHERE id = ?", (holder,))

    def wait(self, timeout: float) -> None:
        time.sleep(timeout)  # SQLite has no notifications: a joiner polls (see the module docstring)

    def close(self) -> None:
        self.db.close()


class SqliteTx:
    """A write transaction on a SQLite store (see ``_store.Tx``)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def get(self, key: str) -> Row | None:
        found = self.db.execute(f"SELECT {COLUMNS} FROM procq_keys WHERE key = ?", (key,)).fetchone()
        return Row(*found) if found else None

    def holder_alive(self, holder: str) -> bool:
        found = self.db.execute("SELECT expires FROM procq_holders WHERE id = ?", (holder,)).fetchone()
        return found is not None and found[0] >= time.time()

    def put(self, row: Row) -> None:
        self.db.execute(
            f"INSERT OR REPLACE INTO procq_keys ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (row.key, row.state, row.run, row.holder, row.fp, row.output, row.encoding, row.failure,
             row.attempts, row.not_before, row.created, row.ended),
        )  # fmt: skip

    def settle(
        self, key: str, run: str, state: str, output: bytes | None, encoding: str | None,
        failure: str | None, attempts: int,
    ) -> bool:  # fmt: skip
        cur = self.db.execute(
            "UPDATE procq_keys SET state = ?, output = ?, encoding = ?, failure = ?, attempts = ?, ended = ?, "
            "holder = NULL WHERE key = ? AND run = ? AND state = 'live'",
            (state, output, encoding, failure, attempts, time.time(), key, run),
        )
        return cur.rowcount > 0

    def delete(self, key: str, run: str | None) -> bool:
        if run is None:
            cur = self.db.execute("DELETE FROM procq_keys WHERE key = ? AND state != 'live'", (key,))
        else:
            cur = self.db.execute("DELETE FROM procq_keys WHERE key = ? AND run = ?", (key, run))
        return cur.rowcount > 0
