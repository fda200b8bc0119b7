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

How a claim is decided (``Conn.claim``, then ``judge``, inside a write
transaction that holds the key: SQLite's write lock, or PostgreSQL's
transaction-scoped advisory lock on the key): no row: the caller's live row is
inserted at once; a failed row (``reuse`` allowing) or a done one with
``reuse="always"``: the caller's row replaces it (``CLAIMED``, with what it
replaced, to restore if the claim is abandoned); a done row: ``CACHED``; a live
row of a live holder: ``REMOTE``; a failed row under ``reuse="never"``:
``FAILED``.

The backends (``_stores.sqlite``, ``_stores.postgres``) supply connections
(``Conn``) with a handful of statements; everything else is here and in
``_durable.core``, ``_durable.commit`` and ``_durable.remote``.
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
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any, NamedTuple, Protocol

from procq._model.errors import ProcQueueError
from procq._model.values import Completed, Failed, Failure
from procq._wire.fingerprint import MAX_BYTES, MAX_NODES, _digest, _encode, _head, _TooCostly

__all__ = [
    "SCHEMA",
    "Conn",
    "Found",
    "Row",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "Taken",
    "decode_outcome",
    "decode_output",
    "encode_outcome",
    "interrupted",
    "judge",
    "stable_fingerprint",
]

#: The schema this procq writes. A store whose schema is newer is refused.
SCHEMA = 1


class StoreError(ProcQueueError):
    """A store cannot be used as it is: a newer schema, a bad URL."""

    __module__ = "procq"  # its public name, printed and pickled as procq.<name>


class StoreUnavailable(StoreError):
    """The store's database cannot be reached or written now (gone, locked,
    read-only, full). Nothing was pushed; running jobs go on, and their
    outcomes are written once it is back."""

    __module__ = "procq"  # its public name, printed and pickled as procq.<name>


class Row(NamedTuple):
    """One key's row (see the module docstring). A named tuple, not a frozen
    dataclass: it goes to the database as it is (its fields are the columns,
    in ``COLUMNS`` order), and one is made and copied per job."""

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
    """What ``judge`` found for a key."""

    CLAIMED = "claimed"  # the caller may claim it (over the row judged, if any)
    REMOTE = "remote"  # live, held by another queue whose lease holds
    CACHED = "cached"  # done: its row has the output
    FAILED = "failed"  # failed, and reuse="never"


class Taken(enum.Enum):
    """How ``Conn.claim`` went, when it did not return the key's row."""

    INSERTED = "inserted"  # there was no row: the caller's live row is written
    BUSY = "busy"  # another transaction holds the key (only when told not to wait)


class Conn(Protocol):
    """One connection to a store; used by one thread at a time (its queue's
    ``StoreCore.db_lock``). Writes happen inside ``begin`` ... ``commit``;
    a claim's statements need the key held, which the transaction does
    (SQLite: its write lock holds the whole file; PostgreSQL: the key's
    transaction-scoped advisory lock, taken by ``claim`` and ``lock_all``)."""

    in_tx: bool

    def begin(self) -> None: ...
    def commit(self) -> None: ...
    def rollback(self) -> None:
        """Roll back, and never raise (a broken connection is rolled back by its end)."""

    def claim(self, row: Row, wait: bool) -> Taken | tuple[Row, bool]:
        """Hold ``row.key`` and insert ``row`` (a fresh live row: no outcome,
        attempts 1) if the key has no row
        (``INSERTED``); else return the key's row and whether its holder's
        lease holds. ``BUSY``: another transaction holds the key and
        ``wait`` was false."""

    def lock_all(self, keys: list[str]) -> None:
        """Hold every key of a batch, in sorted order (waiting for them)."""

    def claim_held(self, rows: list[Row]) -> list[Taken | tuple[Row, bool]]:
        """``claim`` of every row's key, in one statement where the database
        can: the keys are held already (``lock_all``), each a key once."""

    def exists(self, key: str) -> bool:
        """Has the key a row? (Inside the transaction that holds the key.)"""

    def insert(self, rows: list[Row]) -> None:
        """Insert rows of keys that had none when the transaction took them
        (``exists``); a key that has a row meanwhile keeps it."""

    def put(self, row: Row) -> None:
        """Write ``row`` over the key's row (the key is held)."""

    def settle(self, rows: list[Row]) -> None:
        """Write ended rows, each only over its own live claim (``run``) or
        where the key has no row; a row claimed again since is left alone."""

    def delete(self, key: str, run: str | None) -> bool:
        """Delete the key's row: its claim ``run``'s, or (None) an ended one."""

    def restore(self, key: str, run: str, prev: Row) -> None:
        """Put ``prev`` back where claim ``run`` replaced it (if that claim is still the row)."""

    def move_not_before(self, key: str, run: str, not_before: float) -> bool:
        """Move a live row's ``not_before`` earlier (and tell its holder)."""

    def scheduled(self, holder: str) -> dict[str, float]:
        """The not_before of every live row ``holder`` holds that has one."""

    def read(self, key: str, whole: bool = True) -> Row | None:
        """The key's row; ``whole=False``: its output as the row holds it (a
        spilled output's stub: see ``spill``)."""

    def read_done(self, key: str) -> tuple[bytes, str | None, bytes | None, float] | None:
        """(output, encoding, fp, ended) of the key's row if it is done."""

    def rows(self, keys: list[str]) -> dict[str, Row]: ...
    def scan(self, prefix: str | None) -> list[Row]: ...
    def dead_holders(self) -> set[str]:
        """Holders of live rows whose lease has expired (or that have none)."""

    def counts(self) -> tuple[int, int]:
        """How many rows are done, and failed."""

    def renew(self, holder: str, lease: float) -> None: ...
    def purge(self, ttl: float | None, failed_ttl: float | None, max_completed: int | None) -> int:
        """Delete rows past their retention, a bounded batch per statement; returns how many."""

    def release(self, holder: str) -> None: ...
    def wait(self, timeout: float) -> set[str]:
        """Sleep up to ``timeout``, or until a row may have changed (PostgreSQL's
        NOTIFY): the channels that told."""

    def raw(self) -> Any:
        """The DB-API connection underneath, for a caller's own statements."""

    def spill(self, key: str, run: str, output: bytes, encoding: str) -> tuple[bytes, str] | None:
        """Write a large encoded ``output`` of the claim ``run`` of ``key`` in
        pieces, each in a transaction of its own (where ``Store.spill_over``);
        the output and encoding its ended row holds instead, or None if the
        claim's live row is not there."""

    def drop_orphans(self) -> int:
        """Delete the pieces of spilled outputs that no row needs; how many."""

    def close(self) -> None: ...


class Store:
    """Where keys outlive the queue: a database shared by queues (see
    ``open_store`` for the URLs). ``lease`` (seconds): how long a queue that
    stopped renewing is taken for alive; ``poll`` (seconds): how often a
    joiner of another queue's key looks for its end, where the database
    cannot say."""

    url: str
    #: Read a key's row before claiming it (a done key then costs no write).
    read_first = True
    #: A push's claim of a key with no row is written with the group
    #: transaction's other writes, not by a statement of its own (see
    #: ``_durable.commit``): where the transaction's lock holds every key.
    defers_claims = False
    #: A batch's claims are made in one statement (``Conn.claim_held``).
    claims_batches = False
    #: An output longer than this (bytes, encoded) is written in pieces
    #: before its row (``Conn.spill``); None: never.
    spill_over: int | None = None

    def __init__(self, lease: float = 10.0, poll: float = 0.01) -> None:
        if not lease > 0 or not poll > 0:
            raise ValueError(f"a store's lease and poll must be positive, got lease={lease}, poll={poll}")
        self.lease = lease
        self.poll = poll

    def connect(self) -> Conn:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"


def stable_fingerprint(job: Any) -> bytes:
    """A job's fingerprint (``_wire.fingerprint``) as every process computes it.
    The in-memory fingerprint hashes flat arguments with ``hash()``, which is
    salted per process: a row keeps this one, made from the arguments' text."""
    fn, args, kwargs = job.fn, job.args, job.kwargs
    while isinstance(fn, functools.partial):
        args = (*fn.args, *args)
        kwargs = {**fn.keywords, **(kwargs or {})}
        fn = fn.func
    head = _head(fn)
    if not args and not kwargs:
        return head + _NO_ARGS
    try:
        return head + _args_digest(args, kwargs or {})
    except (_TooCostly, RecursionError):
        return head


def _args_digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    parts: list[str] = []
    _encode(args, parts, [MAX_NODES, MAX_BYTES])
    _encode(kwargs, parts, [MAX_NODES, MAX_BYTES])
    return _digest("".join(parts))


_NO_ARGS = _args_digest((), {})  # the digest every call without arguments shares


def holder_id() -> str:
    """A new queue's identity in a store: unique across machines."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def holder_gone(holder: str | None) -> bool:
    """Is ``holder`` a queue of this machine whose process has ended? Then its
    keys need not wait for its lease to expire. (A process ended but not yet
    reaped, or a pid used again, reads as alive: the lease decides then.)"""
    if not holder:
        return False
    parts = holder.split(":")  # host:pid:token (see holder_id)
    if len(parts) < 3 or ":".join(parts[:-2]) != socket.gethostname():
        return False
    try:
        os.kill(int(parts[-2]), 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError):
        return False
    return False


def judge(
    row: Row | None, alive: bool, reuse: str, holder: str, expired: Callable[[Row], bool]
) -> tuple[Found, Row | None, Row | None]:
    """What a push finds in ``row``, the key's row read while the key is held:
    ``(found, row, interrupted)``. ``alive``: the row's holder's lease holds;
    ``expired(row)``: an ended row's retention is over (it counts as absent).
    A live row whose holder is gone (or is the caller's queue, which holds the
    key no more) ends as ``interrupted`` first: the caller writes that row,
    and the push goes on from it."""
    if row is not None and row.state != "live" and expired(row):
        row = None
    ended = None
    if row is not None and row.state == "live":
        if row.holder != holder and alive:
            return Found.REMOTE, row, None
        row = ended = interrupted(row)
    if row is not None and row.state == "done" and reuse != "always":
        return Found.CACHED, row, ended
    if row is not None and row.state == "failed" and reuse == "never":
        return Found.FAILED, row, ended
    return Found.CLAIMED, row, ended


def interrupted(row: Row) -> Row:
    """A live row whose holder's lease expired, as the failed row it becomes."""
    failure = Failure(
        "interrupted",
        f"job {row.key!r} was interrupted: its queue ({row.holder}) stopped renewing its lease before the job ended",
    )
    return row._replace(state="failed", failure=encode_failure(failure), ended=time.time())


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
        return Completed(decode_output(output, encoding))
    assert failure is not None
    return Failed(decode_failure(json.loads(failure)))


def decode_output(output: bytes, encoding: str | None) -> Any:
    # A store is as trusted as the code that opens it: its pickles are loaded.
    return pickle.loads(output) if encoding == "pickle" else json.loads(output)


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
