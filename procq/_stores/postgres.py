"""The PostgreSQL store: one database, shared by queues on any machine that reaches it.

psycopg 3 (``pip install 'procq[postgres]'``), imported only when a store is
opened. Every writer of a key's row first takes the key's transaction-scoped
advisory lock (``pg_advisory_xact_lock`` on a hash of the key), so once a
claim has found a key free no other transaction can claim it before this one
ends. A claim is one round trip: the server-side function ``procq_claim``
takes the lock (or, told not to wait, says the key is busy, and the caller
commits its own group transaction before it waits: no two queues ever wait on
each other in a cycle), inserts the caller's live row if the key has none,
else returns the row and whether its holder's lease holds. A batch locks its
keys in sorted order (``procq_lock_all``). Lease times are the database's own
clock (``clock_timestamp()``), so machines whose clocks differ agree on when a
lease expired. A transaction that ends a row sends ``NOTIFY procq_ended,
'<key>'``, delivered at commit: joiners in other queues ``LISTEN`` and read
the row at once; a wake sends ``NOTIFY procq_wake`` to the key's holder. A
connection the server dropped is opened again at its next use.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any

from procq._stores.base import COLUMNS, SCHEMA, Row, Store, StoreError, StoreUnavailable, Taken

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
    # A claim in one round trip: hold the key (or say it is busy), insert the
    # caller's live row if the key has none, else return the row and whether
    # its holder's lease holds, for the caller to judge.
    f"""CREATE OR REPLACE FUNCTION procq_claim(
            k text, r text, h text, f bytea, nb double precision, c double precision, w boolean)
        RETURNS TABLE (o_taken text, o_key text, o_state text, o_run text, o_holder text, o_fp bytea,
            o_output bytea, o_encoding text, o_failure text, o_attempts integer, o_not_before double precision,
            o_created double precision, o_ended double precision, o_alive boolean)
        LANGUAGE plpgsql AS $$
        BEGIN
            IF w THEN
                PERFORM pg_advisory_xact_lock(hashtextextended(k, 0));
            ELSIF NOT pg_try_advisory_xact_lock(hashtextextended(k, 0)) THEN
                RETURN QUERY SELECT 'busy', k, NULL::text, NULL::text, NULL::text, NULL::bytea, NULL::bytea,
                    NULL::text, NULL::text, NULL::integer, NULL::double precision, NULL::double precision,
                    NULL::double precision, NULL::boolean;
                RETURN;
            END IF;
            INSERT INTO procq_keys AS p (key, state, run, holder, fp, attempts, not_before, created)
                VALUES (k, 'live', r, h, f, 1, nb, c) ON CONFLICT (key) DO NOTHING;
            IF FOUND THEN
                RETURN QUERY SELECT 'inserted', k, NULL::text, NULL::text, NULL::text, NULL::bytea, NULL::bytea,
                    NULL::text, NULL::text, NULL::integer, NULL::double precision, NULL::double precision,
                    NULL::double precision, NULL::boolean;
                RETURN;
            END IF;
            RETURN QUERY SELECT 'found', p.key, p.state, p.run, p.holder, p.fp, p.output, p.encoding, p.failure,
                p.attempts, p.not_before, p.created, p.ended, coalesce(hh.expires >= {_NOW}, false)
                FROM procq_keys p LEFT JOIN procq_holders hh ON hh.id = p.holder WHERE p.key = k;
        END $$""",
    # A batch's claims in one round trip (its keys already held: procq_lock_all):
    # for each key in order, its index and what procq_claim would say.
    f"""CREATE OR REPLACE FUNCTION procq_claim_all(
            ks text[], rs text[], h text, fs bytea[], nbs double precision[], cs double precision[])
        RETURNS TABLE (o_i integer, o_taken text, o_key text, o_state text, o_run text, o_holder text,
            o_fp bytea, o_output bytea, o_encoding text, o_failure text, o_attempts integer,
            o_not_before double precision, o_created double precision, o_ended double precision, o_alive boolean)
        LANGUAGE plpgsql AS $$
        BEGIN
            FOR i IN 1 .. coalesce(array_length(ks, 1), 0) LOOP
                INSERT INTO procq_keys AS p (key, state, run, holder, fp, attempts, not_before, created)
                    VALUES (ks[i], 'live', rs[i], h, fs[i], 1, nbs[i], cs[i]) ON CONFLICT (key) DO NOTHING;
                IF FOUND THEN
                    RETURN QUERY SELECT i, 'inserted', ks[i], NULL::text, NULL::text, NULL::text, NULL::bytea,
                        NULL::bytea, NULL::text, NULL::text, NULL::integer, NULL::double precision,
                        NULL::double precision, NULL::double precision, NULL::boolean;
                ELSE
                    RETURN QUERY SELECT i, 'found', p.key, p.state, p.run, p.holder, p.fp, p.output, p.encoding,
                        p.failure, p.attempts, p.not_before, p.created, p.ended, coalesce(hh.expires >= {_NOW}, false)
                        FROM procq_keys p LEFT JOIN procq_holders hh ON hh.id = p.holder WHERE p.key = ks[i];
                END IF;
            END LOOP;
        END $$""",
    """CREATE OR REPLACE FUNCTION procq_lock_all(ks text[]) RETURNS void LANGUAGE plpgsql AS $$
        DECLARE k text;
        BEGIN
            FOREACH k IN ARRAY ks LOOP
                PERFORM pg_advisory_xact_lock(hashtextextended(k, 0));
            END LOOP;
        END $$""",
]
_MARKS = ", ".join(["%s"] * 12)
_PUT = (
    f"INSERT INTO procq_keys ({COLUMNS}) VALUES ({_MARKS}) ON CONFLICT (key) DO UPDATE SET "
    "state = EXCLUDED.state, run = EXCLUDED.run, holder = EXCLUDED.holder, fp = EXCLUDED.fp, "
    "output = EXCLUDED.output, encoding = EXCLUDED.encoding, failure = EXCLUDED.failure, "
    "attempts = EXCLUDED.attempts, not_before = EXCLUDED.not_before, created = EXCLUDED.created, "
    "ended = EXCLUDED.ended"
)
# An ended row goes over its own live claim only; with no row (its claim was
# lost, say with a connection the server dropped) it is inserted.
_SETTLE = (
    f"INSERT INTO procq_keys ({COLUMNS}) VALUES ({_MARKS}) ON CONFLICT (key) DO UPDATE SET "
    "state = EXCLUDED.state, output = EXCLUDED.output, encoding = EXCLUDED.encoding, "
    f"failure = EXCLUDED.failure, attempts = EXCLUDED.attempts, ended = {_NOW}, holder = NULL "
    "WHERE procq_keys.run = EXCLUDED.run AND procq_keys.state = 'live'"
)
_RESTORE = (
    "UPDATE procq_keys SET state = %s, run = %s, holder = %s, fp = %s, output = %s, encoding = %s, "
    "failure = %s, attempts = %s, not_before = %s, created = %s, ended = %s WHERE key = %s AND run = %s"
)
_CLAIM = "SELECT * FROM procq_claim(%s, %s, %s, %s, %s, %s, %s)"
_CLAIM_ALL = "SELECT * FROM procq_claim_all(%s::text[], %s::text[], %s, %s::bytea[], %s::float8[], %s::float8[])"
_READ_DONE = "SELECT output, encoding, fp, ended FROM procq_keys WHERE key = %s AND state = 'done'"
_BATCH = 500  # rows a retention sweep deletes per statement
# The advisory lock that serialises creating the schema (any constant of our own).
_SCHEMA_LOCK = 0x70726F6371


class PostgresStore(Store):
    """A PostgreSQL database as a store (``ProcQueue(store="postgresql://...")``)."""

    read_first = False  # a claim reads the row in the same round trip
    claims_batches = True  # a batch's keys are claimed in one round trip (claim_held)

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
    """One connection to a PostgreSQL store (see ``_stores.base.Conn``). A
    connection the server dropped (a restart, a network cut) is opened again
    at its next use; until then every use raises ``StoreUnavailable``."""

    notifies = True

    def __init__(self, url: str) -> None:
        self.url = url
        self._pg = _psycopg()
        self._errors = (self._pg.OperationalError, self._pg.InterfaceError)
        self.in_tx = False
        self._listening: tuple[str, ...] = ()  # the channels it listens on (again after a reconnect)
        self.db: Any = None
        self._cur: Any = None
        self._open()
        try:
            with self._tx():
                db: Any = self.db
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
            self.close()
            raise

    def _open(self) -> None:
        try:
            self.db = self._pg.connect(self.url, autocommit=True)
            # One cursor for the connection's statements, results in binary:
            # a cursor made per statement, and text parsed per value, cost
            # more client CPU than the round trip they wait on.
            self._cur = self.db.cursor(binary=True)
            for channel in self._listening:
                self.db.execute(f"LISTEN {channel}")
        except self._errors as exc:
            self._drop()
            raise self._unavailable(exc) from exc

    def _drop(self) -> None:
        """Forget a connection that failed: the next use opens a new one."""
        db, self.db, self._cur, self.in_tx = self.db, None, None, False
        if db is not None:
            with contextlib.suppress(Exception):
                db.close()

    def _unavailable(self, exc: Exception) -> StoreUnavailable:
        return StoreUnavailable(f"the PostgreSQL store {_safe(self.url)} cannot be used now: {exc}")

    def _exec(self, sql: str, args: Any = None) -> Any:
        """One statement; a lost connection is dropped, and said as ``StoreUnavailable``."""
        if self.db is None:
            if self.in_tx:
                raise self._unavailable(RuntimeError("the connection was lost in this transaction"))
            self._open()
        try:
            return self._cur.execute(sql, args)
        except self._errors as exc:
            self._drop()
            raise self._unavailable(exc) from exc

    @contextlib.contextmanager
    def _tx(self) -> Iterator[None]:
        self.begin()
        try:
            yield
        except BaseException:
            self.rollback()
            raise
        self.commit()

    def begin(self) -> None:
        self._exec("BEGIN")
        self.in_tx = True

    def commit(self) -> None:
        try:
            self._exec("COMMIT")
        finally:
            self.in_tx = False

    def rollback(self) -> None:
        self.in_tx = False
        if self.db is not None:
            try:
                self.db.execute("ROLLBACK")
            except Exception:
                self._drop()

    def _query(self, sql: str, args: Any = None) -> list[Any]:
        cur = self._exec(sql, args)
        return list(cur.fetchall()) if cur.description is not None else []

    def claim(self, row: Row, wait: bool) -> Taken | tuple[Row, bool]:
        found = self._exec(_CLAIM, (row.key, row.run, row.holder, row.fp, row.not_before, row.created, wait)).fetchone()
        taken = found[0]
        if taken == "inserted":
            return Taken.INSERTED
        if taken == "busy":
            return Taken.BUSY
        return _row(found[1:-1]), bool(found[-1])

    def lock_all(self, keys: list[str]) -> None:
        self._exec("SELECT procq_lock_all(%s)", (sorted(set(keys)),))

    def claim_held(self, rows: list[Row]) -> list[Taken | tuple[Row, bool]]:
        args = ([r.key for r in rows], [r.run for r in rows], rows[0].holder, [r.fp for r in rows],
                [r.not_before for r in rows], [r.created for r in rows])  # fmt: skip
        found = sorted(self._query(_CLAIM_ALL, args))
        return [Taken.INSERTED if f[1] == "inserted" else (_row(f[2:-1]), bool(f[-1])) for f in found]

    def exists(self, key: str) -> bool:
        return self._exec("SELECT 1 FROM procq_keys WHERE key = %s", (key,)).fetchone() is not None

    def insert(self, rows: list[Row]) -> None:
        self.settle(rows)  # (a key with no row gets its row; one claimed since is left alone)

    def put(self, row: Row) -> None:
        self._exec(_PUT, _values(row))
        if row.state != "live":
            self._exec("SELECT pg_notify('procq_ended', %s)", (row.key,))

    def settle(self, rows: list[Row]) -> None:
        if self.db is None:
            self._exec("SELECT 1")  # opens it again, or says it cannot
        try:
            with self.db.cursor() as cur:
                cur.executemany(_SETTLE, [_values(r) for r in rows])
                cur.execute("SELECT pg_notify('procq_ended', k) FROM unnest(%s::text[]) AS k", ([r.key for r in rows],))
        except self._errors as exc:
            self._drop()
            raise self._unavailable(exc) from exc

    def delete(self, key: str, run: str | None) -> bool:
        if run is None:
            cur = self._exec("DELETE FROM procq_keys WHERE key = %s AND state != 'live'", (key,))
        else:
            cur = self._exec("DELETE FROM procq_keys WHERE key = %s AND run = %s", (key, run))
        return bool(cur.rowcount > 0)

    def restore(self, key: str, run: str, prev: Row) -> None:
        self._exec(_RESTORE, (*_values(prev)[1:], key, run))
        if prev.state != "live":
            self._exec("SELECT pg_notify('procq_ended', %s)", (key,))

    def move_not_before(self, key: str, run: str, not_before: float) -> bool:
        sql = (
            "UPDATE procq_keys SET not_before = %s WHERE key = %s AND run = %s AND state = 'live' "
            "AND (not_before IS NULL OR not_before > %s)"
        )
        if self._exec(sql, (not_before, key, run, not_before)).rowcount > 0:
            self._exec("SELECT pg_notify('procq_wake', %s)", (key,))
            return True
        return False

    def scheduled(self, holder: str) -> dict[str, float]:
        sql = "SELECT key, not_before FROM procq_keys WHERE holder = %s AND state = 'live' AND not_before IS NOT NULL"
        return dict(self._query(sql, (holder,)))

    def spill(self, key: str, run: str, output: bytes, encoding: str) -> tuple[bytes, str] | None:
        return None  # (PostgreSQL writes a large row without stopping other writers: no pieces)

    def drop_orphans(self) -> int:
        return 0

    def raw(self) -> Any:
        if self.db is None:
            self._exec("SELECT 1")
        return self.db

    def read(self, key: str, whole: bool = True) -> Row | None:
        found = self._query(f"SELECT {COLUMNS} FROM procq_keys WHERE key = %s", (key,))
        return _row(found[0]) if found else None

    def read_done(self, key: str) -> tuple[bytes, str | None, bytes | None, float] | None:
        found = self._query(_READ_DONE, (key,))
        if not found:
            return None
        output, encoding, fp, ended = found[0]
        return bytes(output), encoding, None if fp is None else bytes(fp), ended

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
                n = self._exec(sql, args).rowcount
                deleted += n
                if n < _BATCH:
                    break
        return deleted

    def release(self, holder: str) -> None:
        self._query("DELETE FROM procq_holders WHERE id = %s", (holder,))

    def listen(self, own: str | None = None) -> None:
        """Be told (``wait``) of every row that ends, and every wake, from now
        on; and of ``nudge(own)``, a channel of this listener's own."""
        self._listening = ("procq_ended", "procq_wake", *(() if own is None else (own,)))
        for channel in self._listening:
            self._exec(f"LISTEN {channel}")

    def nudge(self, channel: str) -> None:
        """End the ``wait`` of whoever listens on ``channel`` now."""
        self._exec(f"NOTIFY {channel}")

    def wait(self, timeout: float) -> set[str]:
        """Up to ``timeout``, until notified; returns the channels that were."""
        if self.db is None:
            self._exec("SELECT 1")
        try:
            return {n.channel for n in self.db.notifies(timeout=timeout, stop_after=1)}
        except self._errors as exc:
            self._drop()
            raise self._unavailable(exc) from exc

    def close(self) -> None:
        self._drop()


def _values(r: Row) -> tuple[Any, ...]:
    return (r.key, r.state, r.run, r.holder, r.fp, r.output, r.encoding, r.failure,
            r.attempts, r.not_before, r.created, r.ended)  # fmt: skip


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
