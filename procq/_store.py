"""Durable key records shared by queues: the ``Store`` interface, its rows, and
how a claim is decided on them.

A queue opened with ``store=`` keeps every key's record in a database that
any number of queues (threads, processes, machines) share. Two tables and a
version (the tables are named ``procq_*``, beside the application's own)::

    keys     key PRIMARY KEY, state ('live' | 'done' | 'failed'), run, holder,
             fp, output, encoding ('pickle' | 'json'), failure (JSON),
             attempts, not_before, created, ended     (times: Unix seconds)
    holders  id PRIMARY KEY, pid, host, expires       (one row per open queue: its lease)
    meta     name PRIMARY KEY, value                  ('schema' -> SCHEMA)

A ``live`` row belongs to one claim (``run``) of one queue (``holder``). The
holder renews its lease; once ``holders.expires`` has passed (the queue died,
even by SIGKILL), its live rows are *interrupted*: whoever meets one next (a
push, a joiner's poll, ``q.state``) rewrites it as failed, kind
``"interrupted"``, guarded by its ``run``, so it is rewritten once.

How a claim is decided (``decide``, inside one write transaction that holds
the key: SQLite's write lock, or PostgreSQL's transaction-scoped advisory lock
on the key): no row, or a failed one (``reuse`` allowing), or a done one with
``reuse="always"``: the caller's row replaces it (``CLAIMED``, with what it
replaced, to restore if the claim is abandoned); a done row: ``CACHED``; a live
row of a live holder: ``REMOTE`` (or ``MINE``, this queue's own); a failed row
under ``reuse="never"``: ``FAILED``.

The backends (``_store_sqlite``, ``_store_postgres``) supply connections
(``Conn``) with a handful of statements; everything else is here and in
``_store_core``.
"""

from __future__ import annotations

import enum
import functools
import json
import os
import pickle
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from procq._errors import ProcQueueError
from procq._fingerprint import MAX_BYTES, MAX_NODES, _digest, _encode, _head, _TooCostly
from procq._values import Completed, Failed, Failure

__all__ = [
    "SCHEMA",
    "Conn",
    "Found",
    "Row",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "Tx",
    "decide",
    "decode_outcome",
    "encode_outcome",
    "interrupted",
    "open_store",
    "stable_fingerprint",
]

#: The schema this procq writes. A store whose schema is newer is refused.
SCHEMA = 1


class StoreError(ProcQueueError):
    """A store cannot be used as it is: a newer schema, a bad URL."""


class StoreUnavailable(StoreError):
    """The store's database cannot be reached or written now (gone, locked,
    read-only, full). Nothing was pushed; running jobs go on, and their
    outcomes are written once it is back."""


@dataclass(frozen=True)
class Row:
    """One key's row (see the module docstring)."""

    key: str
    state: str  # 'live' | 'done' | 'failed'
    run: str
    holder: str | None
    fp: bytes | None
    output: bytes | None
    encoding: str | None
    failure: str | None
    attempts: int
    not_before: float | None
    created: float
    ended: float | None

    def outcome(self) -> Completed[Any] | Failed:
        assert self.state != "live", self
        return decode_outcome(self.state, self.output, self.encoding, self.failure)


COLUMNS = "key, state, run, holder, fp, output, encoding, failure, attempts, not_before, created, ended"


class Found(str, enum.Enum):
    """What ``decide`` found for a key."""

    CLAIMED = "claimed"  # the caller's live row is written; Decision.row: what it replaced (or None)
    MINE = "mine"  # live, held by the caller's own queue
    REMOTE = "remote"  # live, held by another queue whose lease holds
    CACHED = "cached"  # done: Decision.row has its output
    FAILED = "failed"  # failed, and reuse="never"


class Tx(Protocol):
    """The statements a claim needs, inside one transaction that holds the key."""

    def get(self, key: str) -> Row | None: ...
    def holder_alive(self, holder: str) -> bool: ...
    def put(self, row: Row) -> None: ...
    def settle(self, key: str, run: str, state: str, output: bytes | None, encoding: str | None,
               failure: str | None, attempts: int) -> bool: ...  # fmt: skip
    def delete(self, key: str, run: str | None) -> bool: ...


class Conn(Protocol):
    """One connection; used by one thread at a time."""

    def write(self, keys: list[str]) -> AbstractContextManager[Tx]:
        """A write transaction holding ``keys`` (committed on a clean exit)."""

    def read(self, key: str) -> Row | None:
        """The key's row as committed (no lock taken)."""

    def scan(self, prefix: str | None) -> list[Row]: ...
    def dead_holders(self) -> set[str]:
        """Holders of live rows whose lease has expired (or that have none)."""

    def counts(self) -> tuple[int, int]:
        """How many rows are done, and failed."""

    def renew(self, holder: str, lease: float) -> None: ...
    def purge(self, ttl: float | None, failed_ttl: float | None, max_completed: int | None) -> int:
        """Delete rows past their retention, a bounded batch per statement; returns how many."""

    def release(self, holder: str) -> None: ...
    def rows(self, keys: list[str]) -> dict[str, Row]: ...
    def wait(self, timeout: float) -> None:
        """Sleep up to ``timeout``, or until a row may have ended (PostgreSQL's NOTIFY)."""

    def close(self) -> None: ...


class Store:
    """Where keys outlive the queue: a database shared by queues (see
    ``open_store`` for the URLs). ``lease`` (seconds): how long a queue that
    stopped renewing is taken for alive; ``poll`` (seconds): how often a
    joiner of another queue's key looks for its end, where the database
    cannot say."""

    url: str

    def __init__(self, lease: float = 10.0, poll: float = 0.01) -> None:
        if not lease > 0 or not poll > 0:
            raise ValueError(f"a store's lease and poll must be positive, got lease={lease}, poll={poll}")
        self.lease = lease
        self.poll = poll

    def connect(self) -> Conn:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"


def open_store(spec: str | os.PathLike[str] | Store) -> Store:
    """A ``Store`` from ``ProcQueue(store=...)``: a ``Store``, a path or
    ``sqlite:///path`` (SQLite), or ``postgresql://...`` (PostgreSQL)."""
    if isinstance(spec, Store):
        return spec
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        raise TypeError(f"store must be a path, a URL or a procq Store, got {type(spec).__name__}")
    if spec.startswith(("postgresql://", "postgres://")):
        from procq._store_postgres import PostgresStore

        return PostgresStore(spec)
    from procq._store_sqlite import SqliteStore

    if spec.startswith("sqlite://"):
        path = spec[len("sqlite://") :]
        if not path.startswith("/"):
            raise StoreError(f"a SQLite URL is sqlite:///relative/path or sqlite:////absolute/path, got {spec!r}")
        return SqliteStore(path[1:])
    if "://" in spec:
        raise StoreError(f"store {spec!r}: the URL schemes are sqlite:/// and postgresql://")
    return SqliteStore(spec)


def stable_fingerprint(job: Any) -> bytes:
    """A job's fingerprint (``_fingerprint``) as every process computes it.
    The in-memory fingerprint hashes flat arguments with ``hash()``, which is
    salted per process: a row keeps this one, made from the arguments' text."""
    fn, args, kwargs = job.fn, job.args, job.kwargs
    while isinstance(fn, functools.partial):
        args = (*fn.args, *args)
        kwargs = {**fn.keywords, **(kwargs or {})}
        fn = fn.func
    head = _head(fn)
    parts: list[str] = []
    try:
        _encode(args, parts, [MAX_NODES, MAX_BYTES])
        _encode(kwargs or {}, parts, [MAX_NODES, MAX_BYTES])
    except (_TooCostly, RecursionError):
        return head
    return head + _digest("".join(parts))


def holder_id() -> str:
    """A new queue's identity in a store: unique across machines."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def decide(
    tx: Tx,
    key: str,
    reuse: str,
    holder: str,
    make: Callable[[Row | None], Row],
    mine_live: bool,
    expired: Callable[[Row], bool],
) -> tuple[Found, Row | None]:
    """Claim ``key`` for ``holder`` unless its row answers the push (see the
    module docstring). ``make(prev)`` builds the caller's live row;
    ``mine_live``: the caller's queue holds the key live in memory;
    ``expired(row)``: an ended row's retention is over (it counts as absent)."""
    row = tx.get(key)
    if row is not None and row.state != "live" and expired(row):
        row = None
    if row is not None and row.state == "live":
        if row.holder == holder:
            if mine_live:
                return Found.MINE, row
        elif tx.holder_alive(row.holder or ""):
            return Found.REMOTE, row
        else:
            row = interrupted(row)
            tx.settle(key, row.run, row.state, None, None, row.failure, row.attempts)
    if row is not None and row.state == "done" and reuse != "always":
        return Found.CACHED, row
    if row is not None and row.state == "failed" and reuse == "never":
        return Found.FAILED, row
    tx.put(make(row))
    return Found.CLAIMED, row


def interrupted(row: Row) -> Row:
    """A live row whose holder's lease expired, as the failed row it becomes."""
    failure = Failure(
        "interrupted",
        f"job {row.key!r} was interrupted: its queue ({row.holder}) stopped renewing its lease before the job ended",
    )
    return replace(row, state="failed", failure=encode_failure(failure), ended=time.time())


# --- outcomes in rows ---------------------------------------------------------------


def encode_outcome(outcome: Completed[Any] | Failed, trusted: bool) -> tuple[str, bytes | None, str | None, str | None]:
    """(state, output, encoding, failure) for a row. A trusted lane's output
    is pickled; an untrusted lane's, JSON (as it came)."""
    if type(outcome) is Completed:
        if trusted:
            return "done", pickle.dumps(outcome.output, protocol=pickle.HIGHEST_PROTOCOL), "pickle", None
        return "done", json.dumps(outcome.output).encode(), "json", None
    return "failed", None, None, encode_failure(outcome.failure)  # type: ignore[union-attr]


def decode_outcome(
    state: str, output: bytes | None, encoding: str | None, failure: str | None
) -> Completed[Any] | Failed:
    if state == "done":
        assert output is not None
        # A store is as trusted as the code that opens it: its pickles are loaded.
        return Completed(pickle.loads(output) if encoding == "pickle" else json.loads(output))
    assert failure is not None
    return Failed(decode_failure(json.loads(failure)))


def encode_failure(failure: Failure) -> str:
    return json.dumps(_failure_dict(failure))


def _failure_dict(failure: Failure) -> dict[str, Any]:
    d = asdict(replace(failure, history=(), exception=None))
    del d["exception"]
    d["history"] = [_failure_dict(f) for f in failure.history]
    return d


def decode_failure(d: dict[str, Any]) -> Failure:
    history = tuple(decode_failure(h) for h in d.pop("history", ()))
    return Failure(**d, history=history)


def iter_chunks(items: list[str], n: int) -> Iterator[list[str]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]
