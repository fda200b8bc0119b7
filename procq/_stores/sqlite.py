"""The SQLite store: one file, shared by the queues of one machine.

The standard library's ``sqlite3``, in WAL mode (readers never wait for the
writer) with ``synchronous=NORMAL``: a committed write survives the death of
any process (SIGKILL included), though not a power cut. A claim is one
``BEGIN IMMEDIATE`` transaction: SQLite's single write lock is what makes it
atomic across processes. SQLite cannot tell a joiner that a row changed, so a
joiner of another queue's key polls its row (``Store.poll``, 10 ms).

Taking the write lock (``SqliteConn.begin``). SQLite has no queue for its
lock: a connection that finds it taken sleeps and tries again, and its own
busy handler sleeps longer and longer (up to 100 ms a try), so that a program
that lets go of the lock and takes it back at once (as a queue whose pushes
stream does, every group window) starves the others for seconds. So a
connection waits for the lock itself, trying again every ``_TRY_EVERY``
(until ``busy``); and once it has met another holder (within the last
``_CONTENDED`` seconds) it leaves the lock free for ``_LET_GO`` after each
of its transactions before taking it again: long enough for a waiting
program to take its turn. Alone on the file, it never waits.
"""

from __future__ import annotations

import functools
import os
import socket
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from procq._stores import sqlite_spill as spill
from procq._stores.base import COLUMNS, SCHEMA, Row, Store, StoreError, StoreUnavailable, Taken

__all__ = ["SqliteStore"]

_READ_DONE = "SELECT output, encoding, fp, ended, run FROM procq_keys WHERE key = ? AND state = 'done'"
_BATCH = 500  # rows a retention sweep deletes per transaction

_DDL = [
    """CREATE TABLE IF NOT EXISTS procq_keys (
        key TEXT PRIMARY KEY, state TEXT NOT NULL, run TEXT NOT NULL, holder TEXT, fp BLOB,
        output BLOB, encoding TEXT, failure TEXT, attempts INTEGER NOT NULL DEFAULT 1,
        not_before REAL, created REAL NOT NULL, ended REAL)""",
    "CREATE INDEX IF NOT EXISTS procq_keys_live ON procq_keys (holder) WHERE state = 'live'",
    # The ended rows by state and time: a retention sweep finds what to delete,
    # and the counts of q.stats() are read, from this index alone, never a
    # scan of the table (whose rows hold outputs).
    "CREATE INDEX IF NOT EXISTS procq_keys_ended ON procq_keys (state, ended) WHERE state != 'live'",
    "CREATE TABLE IF NOT EXISTS procq_holders (id TEXT PRIMARY KEY, pid INTEGER, host TEXT, expires REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS procq_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    spill.DDL,
]


_MARKS = ", ".join("?" * 12)
# A claim's live row (a fresh one: no outcome, attempts 1; see Conn.claim) with
# its constant columns written in the statement: a push binds 5 values, not 12
# (binding None or bytes is slow in sqlite3: each goes through its adapter
# lookup), and 6 where it has a not_before.
_CLAIM = (
    "INSERT INTO procq_keys (key, state, run, holder, fp, attempts, created, not_before) "
    "VALUES (?, 'live', ?, ?, ?, 1, ?, {}) ON CONFLICT (key) DO NOTHING"
)
_CLAIM_AT, _CLAIM_NOW = _CLAIM.format("?"), _CLAIM.format("NULL")
_EXISTS = "SELECT 1 FROM procq_keys WHERE key = ?"

#: How often a BEGIN tries again for the write lock another connection holds (seconds).
_TRY_EVERY = 0.0005
#: How long a connection leaves the write lock free after a transaction, while
#: others want it (more than ``_TRY_EVERY``: a waiting connection tries within it).
_LET_GO = 0.002
#: How long a connection counts others as wanting the lock after it last waited for it.
_CONTENDED = 1.0


@functools.lru_cache(maxsize=32)
def _insert_sql(n: int, live: bool) -> str:
    """``n`` rows of keys that had none, in one statement: live rows (claims;
    6 values a row, as ``_CLAIM``) or whole rows (claims whose jobs ended
    before they were written)."""
    if live:
        columns = "key, state, run, holder, fp, attempts, created, not_before"
        values = ", ".join(["(?, 'live', ?, ?, ?, 1, ?, ?)"] * n)
    else:
        columns, values = COLUMNS, ", ".join([f"({_MARKS})"] * n)
    return f"INSERT INTO procq_keys ({columns}) VALUES {values} ON CONFLICT (key) DO NOTHING"


_PUT = f"INSERT OR REPLACE INTO procq_keys ({COLUMNS}) VALUES ({_MARKS})"
_GET_WITH_HOLDER = (
    f"SELECT {', '.join('k.' + c for c in COLUMNS.split(', '))}, coalesce(h.expires >= ?, 0) "
    "FROM procq_keys k LEFT JOIN procq_holders h ON h.id = k.holder WHERE k.key = ?"
)
# An ended row goes over its own live claim only; with no row (its claim was
# lost, say to a transaction the store could not commit) it is inserted.
_SETTLE_ROWS = 256  # rows an ended-rows statement writes (12 values each, under SQLite's 32,766)


@functools.lru_cache(maxsize=16)
def _end_sql(n: int) -> str:
    """Ended rows over their own live claims, ``n`` at a time: 8 values a row
    (the upsert, ``_settle_sql``, binds 12, half of them None or bytes, which
    sqlite3 binds slowly), for the rows that have their claims, nearly all."""
    values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * n)
    return (
        "UPDATE procq_keys SET state = v.column3, output = v.column4, encoding = v.column5, failure = v.column6, "
        f"attempts = v.column7, ended = v.column8, holder = NULL FROM (VALUES {values}) AS v "
        "WHERE procq_keys.key = v.column1 AND procq_keys.run = v.column2 AND procq_keys.state = 'live'"
    )


def _chunks(rows: list[Row]) -> Iterator[list[Row]]:
    """``rows`` in chunks of a power of two rows (at most ``_SETTLE_ROWS``):
    a connection prepares a few statements once, not one per batch size."""
    i, n = 0, len(rows)
    while i < n:
        size = min(_SETTLE_ROWS, 1 << ((n - i).bit_length() - 1))
        yield rows[i : i + size]
        i += size


@functools.lru_cache(maxsize=16)
def _settle_sql(n: int) -> str:
    return (
        f"INSERT INTO procq_keys ({COLUMNS}) VALUES {', '.join([f'({_MARKS})'] * n)} ON CONFLICT (key) DO UPDATE SET "
        "state = excluded.state, output = excluded.output, encoding = excluded.encoding, failure = excluded.failure, "
        "attempts = excluded.attempts, ended = excluded.ended, holder = NULL "
        "WHERE procq_keys.run = excluded.run AND procq_keys.state = 'live'"
    )


_UPDATE_FROM = sqlite3.sqlite_version_info >= (3, 33)  # UPDATE ... FROM: SQLite 3.33 (2020)

_RESTORE = (
    "UPDATE procq_keys SET state = ?, run = ?, holder = ?, fp = ?, output = ?, encoding = ?, failure = ?, "
    "attempts = ?, not_before = ?, created = ?, ended = ? WHERE key = ? AND run = ?"
)


class SqliteStore(Store):
    """A SQLite file as a store (``ProcQueue(store="run.db")``)."""

    read_first = True  # a read takes no lock: a done key is answered without the write lock
    defers_claims = True  # the group transaction holds SQLite's one write lock: every key
    spill_over = spill.SPILL_OVER  # large outputs are written in pieces (``_stores.sqlite_spill``)

    def __init__(
        self, path: str | os.PathLike[str], lease: float = 10.0, poll: float = 0.01, busy: float = 30.0
    ) -> None:
        super().__init__(lease, poll)
        self.path = os.fspath(path)
        self.url = f"sqlite:///{self.path}"
        self.busy = busy  # how long a write waits for another process's write lock before StoreUnavailable

    def connect(self) -> SqliteConn:
        return SqliteConn(self.path, self.busy)


def _busy(exc: sqlite3.Error) -> bool:
    """Is ``exc`` SQLite's "the lock is taken" (SQLITE_BUSY)?"""
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY or "locked" in str(exc)


def _unavailable(path: str, exc: Exception) -> StoreUnavailable:
    return StoreUnavailable(f"the SQLite store {path!r} cannot be used now: {exc}")


class SqliteConn:
    """One connection to a SQLite store (see ``_stores.base.Conn``)."""

    def __init__(self, path: str, busy: float = 30.0) -> None:
        self.path = path
        self.busy = busy
        self._busy_timeout = f"PRAGMA busy_timeout = {int(busy * 1000)}"
        self.in_tx = False
        self._ended = 0.0  # when this connection's last write transaction ended (monotonic)
        self._waited = float("-inf")  # when it last waited for another's write lock (monotonic)
        self._spilled = False  # the file is marked as holding spilled outputs (see spill)
        try:
            db = sqlite3.connect(path, timeout=busy, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            raise _unavailable(path, exc) from exc
        self.db = db
        # The cached-key read's own cursor: no cursor made and freed per push.
        # (fetchone() of a key's one row steps to its end: the read ends with it.)
        self._reads = db.cursor()
        try:
            with self._tx():
                for ddl in _DDL:
                    db.execute(ddl)
                found = db.execute("SELECT value FROM procq_meta WHERE name = 'schema'").fetchone()
                if found is None:
                    db.execute("INSERT INTO procq_meta VALUES ('schema', ?)", (str(SCHEMA),))
                elif int(found[0]) > spill.SPILL_SCHEMA:
                    raise StoreError(
                        f"the store {path!r} was written by a newer procq (schema {found[0]}); this procq reads "
                        f"schema {spill.SPILL_SCHEMA} and older: upgrade procq to use it"
                    )
        except BaseException:
            self.db.close()
            raise

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """A short transaction of the connection's own (schema, lease, sweep)."""
        self.begin()
        try:
            yield self.db
        except BaseException:
            self.rollback()
            raise
        self.commit()

    def begin(self) -> None:
        """Take the write lock (see the module docstring), or raise
        ``StoreUnavailable`` after ``busy`` seconds without it."""
        db = self.db
        now = time.monotonic()
        if now - self._waited < _CONTENDED and now - self._ended < _LET_GO:
            time.sleep(self._ended + _LET_GO - now)  # the others' turn (see the module docstring)
        deadline = now + self.busy
        try:
            # SQLite's busy handler off while this waits (its other statements keep it).
            db.execute("PRAGMA busy_timeout = 0")
            try:
                while True:
                    try:
                        db.execute("BEGIN IMMEDIATE")
                        break
                    except sqlite3.OperationalError as exc:
                        if not _busy(exc):
                            raise
                    self._waited = time.monotonic()
                    if self._waited >= deadline:
                        raise sqlite3.OperationalError(f"database is locked (another program held it {self.busy}s)")
                    time.sleep(_TRY_EVERY)
            finally:
                db.execute(self._busy_timeout)
        except sqlite3.Error as exc:
            self.rollback()
            raise _unavailable(self.path, exc) from exc
        self.in_tx = True

    def commit(self) -> None:
        try:
            self.db.execute("COMMIT")
        except sqlite3.Error as exc:
            self.rollback()
            raise _unavailable(self.path, exc) from exc
        self.in_tx = False
        self._ended = time.monotonic()

    def rollback(self) -> None:
        self.in_tx = False
        with suppress(sqlite3.Error):
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
        self._ended = time.monotonic()

    def _write(self, sql: str, args: Any) -> sqlite3.Cursor:
        try:
            return self.db.execute(sql, args)
        except sqlite3.Error as exc:
            raise _unavailable(self.path, exc) from exc

    def claim(self, row: Row, wait: bool) -> Taken | tuple[Row, bool]:
        # The transaction holds SQLite's one write lock: every key is held.
        values = (row.key, row.run, row.holder, row.fp, row.created)
        if row.not_before is None:
            taken = self._write(_CLAIM_NOW, values).rowcount
        else:
            taken = self._write(_CLAIM_AT, (*values, row.not_before)).rowcount
        if taken:
            return Taken.INSERTED
        found = self._write(_GET_WITH_HOLDER, (time.time(), row.key)).fetchone()
        return self._whole(Row(*found[:-1])), bool(found[-1])

    def lock_all(self, keys: list[str]) -> None:
        pass  # the write lock holds every key

    def claim_held(self, rows: list[Row]) -> list[Taken | tuple[Row, bool]]:
        return [self.claim(row, True) for row in rows]

    def exists(self, key: str) -> bool:
        return self._write(_EXISTS, (key,)).fetchone() is not None

    def insert(self, rows: list[Row]) -> None:
        live = [r for r in rows if r.state == "live"]
        ended = [r for r in rows if r.state != "live"] if len(live) < len(rows) else []
        try:
            for chunk in _chunks(live):
                values = [v for r in chunk for v in (r.key, r.run, r.holder, r.fp, r.created, r.not_before)]
                self.db.execute(_insert_sql(len(chunk), True), values)
            for chunk in _chunks(ended):
                self.db.execute(_insert_sql(len(chunk), False), [v for r in chunk for v in r])
        except sqlite3.Error as exc:
            raise _unavailable(self.path, exc) from exc

    def put(self, row: Row) -> None:
        self._write(_PUT, row)

    def settle(self, rows: list[Row]) -> None:
        # One statement a chunk: one step, not one a row. Nearly every row goes
        # over its claim (_end_sql); if any did not, the upsert writes those with
        # no row, leaving alone the ones just ended (no longer live).
        try:
            ended = 0
            if _UPDATE_FROM:
                for chunk in _chunks(rows):
                    values = [v for r in chunk for v in (r.key, r.run, r.state, r.output, r.encoding, r.failure,
                                                          r.attempts, r.ended)]  # fmt: skip
                    ended += self.db.execute(_end_sql(len(chunk)), values).rowcount
            if ended < len(rows):
                for chunk in _chunks(rows):
                    self.db.execute(_settle_sql(len(chunk)), [v for r in chunk for v in r])
        except sqlite3.Error as exc:
            raise _unavailable(self.path, exc) from exc

    def delete(self, key: str, run: str | None) -> bool:
        if run is None:
            return self._write("DELETE FROM procq_keys WHERE key = ? AND state != 'live'", (key,)).rowcount > 0
        return self._write("DELETE FROM procq_keys WHERE key = ? AND run = ?", (key, run)).rowcount > 0

    def restore(self, key: str, run: str, prev: Row) -> None:
        self._write(_RESTORE, (*prev[1:], key, run))

    def move_not_before(self, key: str, run: str, not_before: float) -> bool:
        sql = (
            "UPDATE procq_keys SET not_before = ? WHERE key = ? AND run = ? AND state = 'live' "
            "AND (not_before IS NULL OR not_before > ?)"
        )
        return self._write(sql, (not_before, key, run, not_before)).rowcount > 0

    def scheduled(self, holder: str) -> dict[str, float]:
        sql = "SELECT key, not_before FROM procq_keys WHERE holder = ? AND state = 'live' AND not_before IS NOT NULL"
        return dict(self._query(sql, (holder,)))

    def raw(self) -> sqlite3.Connection:
        return self.db

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        try:
            return self.db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise _unavailable(self.path, exc) from exc

    def read(self, key: str, whole: bool = True) -> Row | None:
        found = self._query(f"SELECT {COLUMNS} FROM procq_keys WHERE key = ?", (key,))
        return (self._whole(Row(*found[0])) if whole else Row(*found[0])) if found else None

    def read_done(self, key: str) -> tuple[bytes, str | None, bytes | None, float] | None:
        try:
            found = self._reads.execute(_READ_DONE, (key,)).fetchone()
            if found is None:
                return None
            output, encoding, fp, ended, run = found
            if encoding is not None and encoding.startswith(spill.SPILLED):
                output, encoding = spill.whole_output(self.db, key, run, output, encoding)
        except sqlite3.Error as exc:
            raise _unavailable(self.path, exc) from exc
        return output, encoding, fp, ended

    def rows(self, keys: list[str]) -> dict[str, Row]:
        marks = ",".join("?" * len(keys))
        sql = f"SELECT {COLUMNS} FROM procq_keys WHERE key IN ({marks})"
        return {r[0]: self._whole(Row(*r)) for r in self._query(sql, tuple(keys))}

    def scan(self, prefix: str | None) -> list[Row]:
        if prefix is None:
            return [self._whole(Row(*r)) for r in self._query(f"SELECT {COLUMNS} FROM procq_keys")]
        # substr, not LIKE: a prefix may hold % and _.
        sql = f"SELECT {COLUMNS} FROM procq_keys WHERE substr(key, 1, ?) = ?"
        return [self._whole(Row(*r)) for r in self._query(sql, (len(prefix), prefix))]

    def _whole(self, row: Row) -> Row:
        """``row`` with its output whole (see ``_stores.sqlite_spill``)."""
        if row.encoding is None or not row.encoding.startswith(spill.SPILLED):
            return row
        try:
            output, encoding = spill.whole_output(self.db, row.key, row.run, row.output, row.encoding)
        except sqlite3.Error as exc:
            raise _unavailable(self.path, exc) from exc
        return row._replace(output=output, encoding=encoding)

    def spill(self, key: str, run: str, output: bytes, encoding: str) -> tuple[bytes, str] | None:
        # Each piece a transaction of its own: the write lock is never held for long.
        try:
            if not self._spilled:
                with self._tx() as db:
                    db.execute("UPDATE procq_meta SET value = ? WHERE name = 'schema' AND CAST(value AS INTEGER) < ?",
                               (str(spill.SPILL_SCHEMA), spill.SPILL_SCHEMA))  # fmt: skip
                self._spilled = True
            for seq, piece in enumerate(spill.pieces(output)):
                with self._tx() as db:
                    if not db.execute(spill.ADD_PIECE, (key, run, seq, piece, key, run)).rowcount:
                        return None  # the claim's row is not there (not yet written, or taken over)
                self.db.execute("PRAGMA wal_checkpoint(PASSIVE)")  # (see _stores.sqlite_spill)
        except sqlite3.Error as exc:
            raise _unavailable(self.path, exc) from exc
        return spill.stub(output), spill.SPILLED + encoding

    def drop_orphans(self) -> int:
        dropped = 0
        for run, seq in self._query(spill.ORPHANS):  # (a read: no lock; then a piece a transaction)
            with self._tx() as db:
                dropped += db.execute(spill.DROP_ORPHAN, (run, seq)).rowcount
        return dropped

    def dead_holders(self) -> set[str]:
        sql = (
            "SELECT DISTINCT k.holder FROM procq_keys k LEFT JOIN procq_holders h ON h.id = k.holder "
            "WHERE k.state = 'live' AND (h.id IS NULL OR h.expires < ?)"
        )
        return {r[0] for r in self._query(sql, (time.time(),))}

    def counts(self) -> tuple[int, int]:
        sql = "SELECT count(*) FROM procq_keys WHERE state = ? AND state != 'live'"  # (the ended index: see _DDL)
        return self._query(sql, ("done",))[0][0], self._query(sql, ("failed",))[0][0]

    def renew(self, holder: str, lease: float) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO procq_holders VALUES (?, ?, ?, ?)",
                (holder, os.getpid(), socket.gethostname(), time.time() + lease),
            )

    def purge(self, ttl: float | None, failed_ttl: float | None, max_completed: int | None) -> int:
        # Short transactions of at most _BATCH rows each: a sweep never holds the write lock for long.
        # (Each condition says state != 'live', which SQLite cannot infer from
        # state = 'done': the ended index, partial, is used only then.)
        deleted = 0
        now = time.time()
        wheres: list[tuple[str, tuple[Any, ...]]] = []
        if ttl is not None:
            wheres.append(("state = 'done' AND ended <= ? AND state != 'live'", (now - ttl,)))
        if failed_ttl is not None:
            wheres.append(("state = 'failed' AND ended <= ? AND state != 'live'", (now - failed_ttl,)))
        for where, args in wheres:
            deleted += self._delete_where(where, args)
        if max_completed is not None:
            # The newest kept row's time, read (no lock) along the ended
            # index; then the older rows go, a batch a transaction, found by
            # the same index. (Rows ended at that very time all stay.)
            sql = (
                "SELECT ended FROM procq_keys WHERE state = 'done' AND state != 'live' "
                "ORDER BY ended DESC LIMIT 1 OFFSET ?"
            )
            found = self._query(sql, (max_completed - 1,)) if max_completed else [(float("inf"),)]
            if found:
                older = ("state = 'done' AND ended < ? AND state != 'live'", (found[0][0],))
                deleted += self._delete_where(*older)
        return deleted

    def _delete_where(self, where: str, args: tuple[Any, ...]) -> int:
        deleted = 0
        while True:
            with self._tx() as db:
                sql = f"DELETE FROM procq_keys WHERE key IN (SELECT key FROM procq_keys WHERE {where} LIMIT ?)"
                n = db.execute(sql, (*args, _BATCH)).rowcount
            deleted += n
            if n < _BATCH:
                return deleted

    def release(self, holder: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM procq_holders WHERE id = ?", (holder,))

    def wait(self, timeout: float) -> set[str]:
        time.sleep(timeout)  # SQLite has no notifications: a joiner polls (see the module docstring)
        return set()

    def close(self) -> None:
        self.db.close()
