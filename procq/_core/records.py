"""Where the state map keeps the keys that ended: the ``KeyRecords`` interface
and its in-memory implementation.

A live key (Pending or Processing) is an ``Entry`` in ``StateMap.live``; once
it ends, its record (``_core.retention.Done`` / ``Fell``) goes to a ``KeyRecords``
store, which answers later pushes of the key (``Job.reuse``), ``q.state``,
``q.keys`` / ``q.handles`` and the completed / failed counts of ``q.stats``.
The store also applies the queue's ``Retention``: a record whose time is up,
or beyond ``max_completed``, is never answered.

``KeyRecords`` is the seam for a durable store (SQLite, PostgreSQL): its
methods are the operations such a store needs (look up a key's record, record
an outcome, drop one, enumerate by prefix and state), never dict access.
``MemoryRecords`` is today's store: a dict beside ``_core.retention.Keeper``.

Every method runs under ``Core.lock``, except ``peek`` on a store whose
``expires`` is false. Times are given (read from ``Core.clock``).
"""

from __future__ import annotations

from typing import Any, Protocol

from procq._core.entries import Face
from procq._core.retention import AT, KEY, NO_TIME, Fell, Keeper, Record
from procq._model.policies import Retention
from procq._model.values import Completed, Failed

__all__ = ["KeyRecords", "MemoryRecords"]


class KeyRecords(Protocol):
    """The records of ended keys (see the module docstring)."""

    #: How many completed and failed keys it answers for (taken records aside).
    completed: int
    failed: int
    #: Records may expire or be evicted: every read must go through ``lookup``.
    #: False: a record changes only when its key is claimed, ended or
    #: forgotten, and ``peek`` may be called without the lock.
    expires: bool
    #: Records expire with time: ``sweep`` reclaims them.
    timed: bool

    def peek(self, key: str) -> Record | None:
        """The key's record, retention aside."""

    def lookup(self, key: str, now: float) -> Record | None:
        """The key's record, or None; an expired record is dropped, never returned."""

    def used(self, rec: Record) -> None:
        """A read was answered from ``rec`` (a cached push, ``q.state``)."""

    def take(self, rec: Record) -> None:
        """A claim took ``rec``'s key: it answers for the key no more, but may
        be given back (``give_back``) until the claim is past its lane's door
        (``release``)."""

    def give_back(self, rec: Record, now: float) -> None:
        """The claim that took ``rec`` was abandoned: ``rec`` answers for its
        key again, unless its time ran out meanwhile."""

    def release(self, rec: Record) -> None:
        """The claim that took ``rec`` went ahead: ``rec`` is gone for good."""

    def record(
        self, key: str, outcome: Completed[Any] | Failed, fp: bytes | None, now: float, face: Face | None = None
    ) -> None:
        """Record how a key ended, at ``now``, with its job's fingerprint (no
        record answers for the key now). ``face``: what the job's handles
        hold (``Entry.face``); a store whose outcomes are given out at once
        completes it when the job completed (``MemoryRecords.record``)."""

    def drop(self, rec: Record) -> None:
        """Forget ``rec``'s key: as if it had never been pushed."""

    def sweep(self, now: float) -> None:
        """Reclaim the records whose time is up."""

    def scan(self, prefix: str | None, now: float, completed: bool, failed: bool) -> list[Record]:
        """The records of keys starting with ``prefix`` (None: every key),
        of completed keys, failed keys or both, in no particular order."""

    def check(self) -> None:
        """Assert the store's own invariants (for ``Core._check_invariants``)."""


class MemoryRecords:
    """``KeyRecords`` in a dict, with ``Keeper`` for the retention orders."""

    __slots__ = ("_keeper", "_records", "completed", "expires", "failed", "peek", "timed")

    def __init__(self, retention: Retention) -> None:
        self._records: dict[str, Record] = {}
        self._keeper = Keeper(retention, self._current)
        self.completed = 0
        self.failed = 0
        self.expires = self._keeper.active
        self.timed = self._keeper.timed
        # A dict read is atomic: without retention, pushes of completed keys
        # read it without the lock (see Core.claim).
        self.peek = self._records.get

    def __len__(self) -> int:
        return len(self._records)

    def _current(self, key: str, at: float) -> Record | None:
        rec = self._records.get(key)
        return rec if rec is not None and rec[AT] == at else None

    def _count(self, rec: Record, n: int) -> None:
        if type(rec) is tuple:
            self.completed += n
        else:
            self.failed += n

    def lookup(self, key: str, now: float) -> Record | None:
        rec = self._records.get(key)
        if rec is not None and self.expires and self._keeper.expired(rec, now):
            self.drop(rec)
            return None
        return rec

    def used(self, rec: Record) -> None:
        self._keeper.used(rec)

    def take(self, rec: Record) -> None:
        del self._records[rec[KEY]]
        self._count(rec, -1)
        self._keeper.detached(rec)

    def give_back(self, rec: Record, now: float) -> None:
        if self._keeper.expired(rec, now):
            self._keeper.dropped(rec)
            return
        self._records[rec[KEY]] = rec
        self._count(rec, 1)
        for old in self._keeper.restored(rec):
            self.drop(old)

    def release(self, rec: Record) -> None:
        self._keeper.dropped(rec)

    def record(
        self, key: str, outcome: Completed[Any] | Failed, fp: bytes | None, now: float, face: Face | None = None
    ) -> None:
        at = now if self.timed else NO_TIME
        rec: Record
        if type(outcome) is Completed:
            output = outcome.output
            rec = (key, output, fp, at)
            if face is not None:
                face.output = output  # (see Face): from now on the handles read this, not the entry
            self.completed += 1
        else:
            rec = Fell(key, outcome.failure, fp, at)  # type: ignore[union-attr]
            self.failed += 1
        self._records[key] = rec
        if self.expires:
            for old in self._keeper.added(rec):
                self.drop(old)

    def drop(self, rec: Record) -> None:
        if self._records.get(rec[KEY]) is rec:
            del self._records[rec[KEY]]
            self._count(rec, -1)
        self._keeper.dropped(rec)

    def sweep(self, now: float) -> None:
        if self.timed:
            self._keeper.due(now, self.drop)

    def scan(self, prefix: str | None, now: float, completed: bool, failed: bool) -> list[Record]:
        found: list[Record] = []
        expired: list[Record] = []
        for key, rec in self._records.items():
            if prefix is not None and not key.startswith(prefix):
                continue
            if self.expires and self._keeper.expired(rec, now):
                expired.append(rec)
            elif completed if type(rec) is tuple else failed:
                found.append(rec)
        for rec in expired:
            self.drop(rec)
        return found

    def check(self) -> None:
        completed = failed = 0
        for key, rec in self._records.items():
            assert rec[KEY] == key, (key, rec)
            if type(rec) is tuple:
                completed += 1
            else:
                assert type(rec) is Fell, (key, rec)
                failed += 1
        assert (completed, failed) == (self.completed, self.failed), (completed, failed, self.completed, self.failed)
        self._keeper.check(completed)
