"""The PostgreSQL store: one database, shared by queues on any machine that reaches it.

psycopg 3 (``pip install 'procq[postgres]'``), imported only when a store is
opened. A claim is one transaction that first takes a transaction-scoped
advisory lock per key (``pg_advisory_xact_lock``, keys in sorted order so two
batches never wait on each other in a cycle), then reads and writes the
keys' rows: every writer of a key's row goes through that lock, so once a
claim has found a key free no other transaction can claim it before this one
ends. Lease times are the database's own clock (``clock_timestamp()``), so
machines whose clocks differ agree on when a lease expired. A transaction
that ends a row sends ``NOTIFY procq_ended, '<key>'``, delivered at commit:
joiners in other queues ``LISTEN`` and read the row at once.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from procq._store import COLUMNS, SCHEMA, Row, Store, StoreError, StoreUnavailable

__all__ = ["PostgresStore"]

_NOW = "extract(epoch from clock_timestamp())"
_DDL = [
    """CREATE TABLE IF NOT EXISTS procq_keys (
        key TEXT PRIMARY KEY, state TEXT NOT NULL, run TEXT NOT NULL, holder TEXT, fp BYTEA,
        output BYTEA, encoding TEXT, failure TEXT, attempts INTEGER NOT NULL DEFAULT 1,
        not_before DOUBLE PRECISION, created DOUBLE PRECISION NOT NULL, ended DOUBLE PRECISION)""",
    "CREATE INDEX IF NOT EXISTS procq_keys_live ON procq_keys (holder) WHERE state = 'live'",
    """CREATE TABLE IF NOT EXISTS procq_holders (
        id TEXT PRIMARY KEY, pid INTEGER, host TEXT, expires DOUBLE PRECISION NOT NULL)""",
    "CREATE TABLE IF NOT EXISTS procq_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
]
_BATCH = 500  # rows a retention sweep deletes per statement
# The advisory lock that serialises creating the schema (any constant of our own).
_SCHEMA_LOCK = 0x70726F6371


class PostgresStore(Store):
    """A PostgreSQL database as a store (``ProcQueue(store="postgresql://...")``)."""

    def __init__(self, url: str, lease: float = 10.0, poll: float = 0.5) -> None:
        # poll: with NOTIFY, only the backstop for what a notification cannot say (a lease expiring).
        super().__init__(lease, poll)
        self.url = url

    def connect(self) -> PostgresConn:
        return PostgresConn(self.url)


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        raise StoreError("a postgresql:// store needs psycopg 3: pip install 'procq[postgres]'") from exc
    return psycopg


class PostgresConn:
    """One connection to a PostgreSQL store (see ``_store.Conn``); it listens for ended rows."""

    notifies = True

    def __init__(self, url: str) -> None:
        self.url = url
        self._pg = pg = _psycopg()
        self._errors = (pg.OperationalError, pg.InterfaceError)
        try:
            self.db = pg.connect(url, autocommit=True)
        except self._errors as exc:
            raise self._unavailable(exc) from exc
        try:
            with self._tx() as db:
                db.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                for ddl in _DDL:
                    db.execute(ddl)
                found = db.execute("SELECT value FROM procq_meta WHERE name = 'schema'").fetchone()
                if found is None:
                    db.execute("INSERT INTO procq_meta VALUES ('schema', %s)", (str(SCHEMA),))
                elif int(found[0]) > SCHEMA:
                    raise StoreError(
                        f"the store {_safe(url)} was written by a newer procq (schema {found[0]}); this procq reads "
                        f"schema {SCHEMA} and older: upgrade procq to use it"
                    )
        except BaseException:
            self.db.close()
            raise

    def _unavailable(self, exc: Exception) -> StoreUnavailable:
        return StoreUnavailable(f"the PostgreSQL store {_safe(self.url)} cannot be used now: {exc}")

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        try:
            with self.db.transaction():
                yield self.db
        except self._errors as exc:
            raise self._unavailable(exc) from exc

    @contextmanager
    def write(self, keys: list[str]) -> Iterator[PostgresTx]:
        with self._tx() as db:
            for key in sorted(keys):
                db.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (key,))
            yield PostgresTx(db)

    def _query(self, sql: str, args: Any = ()) -> list[Any]:
        try:
            cur = self.db.execute(sql, args)
            return list(cur.fetchall()) if cur.description is not None else []
        except self._errors as exc:
            raise self._unavailable(exc) from exc

    def read(self, key: str) -> Row | None:
        found = self._query(f"SELECT {COLUMNS} FROM procq_keys WHERE key = %s", (key,))
        return _row(found[0]) if found else None

    def rows(self, keys: list[str]) -> dict[str, Row]:
        found = self._query(f"SELECT {COLUMNS} FROM procq_keys WHERE key = ANY(%s)", (keys,))
        return {r[0]: _row(r) for r in found}

    def scan(self, prefix: str | None) -> list[Row]:
        if prefix is None:
            return [_row(r) for r in self._query(f"SELECT {COLUMNS} FROM procq_keys")]
        sql = f"SELECT {COLUMNS} FROM procq_keys WHERE left(key, %s) = %s"
        return [_row(r) for r in self._query(sql, (len(prefix), prefix))]

    def dead_holders(self) -> set[str]:
        sql = (
            "SELECT DISTINCT k.holder FROM procq_keys k LEFT JOIN procq_holders h ON h.id = k.holder "
            f"WHERE k.state = 'live' AND (h.id IS NULL OR h.expires < {_NOW})"
        )
        return {r[0] for r in self._query(sql)}

    def counts(self) -> tuple[int, int]:
        found = dict(self._query("SELECT state, count(*) FROM procq_keys WHERE state != 'live' GROUP BY state"))
        return found.get("done", 0), found.get("failed", 0)

    def renew(self, holder: str, lease: float) -> None:
        self._query(
            f"INSERT INTO procq_holders VALUES (%s, %s, %s, {_NOW} + %s) "
            "ON CONFLICT (id) DO UPDATE SET expires = EXCLUDED.expires",
            (holder, os.getpid(), socket.gethostname(), lease),
        )

    def purge(self, ttl: float | None, failed_ttl: float | None, max_completed: int | None) -> int:
        # One bounded batch per statement (autocommit): a sweep never holds many row locks for long.
        deleted = 0
        wheres: list[tuple[str, tuple[Any, ...]]] = []
        if ttl is not None:
            wheres.append((f"state = 'done' AND ended <= {_NOW} - %s LIMIT %s", (ttl, _BATCH)))
        if failed_ttl is not None:
            wheres.append((f"state = 'failed' AND ended <= {_NOW} - %s LIMIT %s", (failed_ttl, _BATCH)))
        if max_completed is not None:
            wheres.append(("state = 'done' ORDER BY ended DESC OFFSET %s LIMIT %s", (max_completed, _BATCH)))
        for where, args in wheres:
            while True:
                sql = f"DELETE FROM procq_keys WHERE key IN (SELECT key FROM procq_keys WHERE {where})"
                try:
                    n = self.db.execute(sql, args).rowcount
                except self._errors as exc:
                    raise self._unavailable(exc) from exc
                deleted += n
                if n < _BATCH:
                    break
        return deleted

    def release(self, holder: str) -> None:
        self._query("DELETE FROM procq_holders WHERE id = %s", (holder,))

    def listen(self) -> None:
        """Be told (``wait``) of every row that ends from now on."""
        self._query("LISTEN procq_ended")

    def wait(self, timeout: float) -> None:
        try:
            for _ in self.db.notifies(timeout=timeout, stop_after=1):
                pass
        except self._errors as exc:
            raise self._unavailable(exc) from exc

    def close(self) -> None:
        self.db.close()


def _row(r: Any) -> Row:
    fp = None if r[4] is None else bytes(r[4])
    output = None if r[5] is None else bytes(r[5])
    return Row(r[0], r[1], r[2], r[3], fp, output, *r[6:])


def _safe(url: str) -> str:
    """The URL without a password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}@{host}"
    return url


class PostgresTx:
    """A write transaction on a PostgreSQL store, holding its keys' advisory locks (see ``_store.Tx``)."""

    def __init__(self, db: Any) -> None:
        self.db = db

    def get(self, key: str) -> Row | None:
        found = self.db.execute(f"SELECT {COLUMNS} FROM procq_keys WHERE key = %s", (key,)).fetchone()
        return _row(found) if found else None

    def holder_alive(self, holder: str) -> bool:
        sql = f"SELECT expires >= {_NOW} FROM procq_holders WHERE id = %s"
        found = self.db.execute(sql, (holder,)).fetchone()
        return found is not None and bool(found[0])

    def put(self, row: Row) -> None:
        self.db.execute(
            f"INSERT INTO procq_keys ({COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (key) DO UPDATE SET state = EXCLUDED.state, run = EXCLUDED.run, holder = EXCLUDED.holder, "
            "fp = EXCLUDED.fp, output = EXCLUDED.output, encoding = EXCLUDED.encoding, failure = EXCLUDED.failure, "
            "attempts = EXCLUDED.attempts, not_before = EXCLUDED.not_before, created = EXCLUDED.created, "
            "ended = EXCLUDED.ended",
            (row.key, row.state, row.run, row.holder, row.fp, row.output, row.encoding, row.failure,
             row.attempts, row.not_before, row.created, row.ended),
        )  # fmt: skip
        if row.state != "live":
            self.db.execute("SELECT pg_notify('procq_ended', %s)", (row.key,))

    def settle(
        self, key: str, run: str, state: str, output: bytes | None, encoding: str | None,
        failure: str | None, attempts: int,
    ) -> bool:  # fmt: skip
        cur = self.db.execute(
            "UPDATE procq_keys SET state = %s, output = %s, encoding = %s, failure = %s, attempts = %s, "
            f"ended = {_NOW}, holder = NULL WHERE key = %s AND run = %s AND state = 'live'",
            (state, output, encoding, failure, attempts, key, run),
        )
        if cur.rowcount > 0:
            self.db.execute("SELECT pg_notify('procq_ended', %s)", (key,))
            return True
        return False

    def delete(self, key: str, run: str | None) -> bool:
        if run is None:
            cur = self.db.execute("DELETE FROM procq_keys WHERE key = %s AND state != 'live'", (key,))
        else:
            cur = self.db.execute("DELETE FROM procq_keys WHERE key = %s AND run = %s", (key, run))
        return bool(cur.rowcount > 0)
