"""What the state map keeps of a key that ended, and for how long.

A key that ended is stored as a small record: ``Done`` (its output) or
``Fell`` (its failure), with the job's fingerprint and the time it ended.
Records hold the output itself, not a ``Completed`` value, and have slots:
with a million kept keys every object per key counts (``bench/memory.py``
measures it).

A ``Done`` is also what the handles on a job hold (``_api.handle``): made
with the job's first handle, it stands for the live entry until the job
completes, then holds its output, and the in-memory store keeps that same
object as the key's record when no retention may change it. A program that
keeps its handles then keeps two objects per completed job (the handle and
this record), not the handle, the entry, its ``Completed`` and a record:
fewer objects for the garbage collector to walk at every collection (in a
push loop of short jobs, the collector took a fifth of the supervisor's time).

``Keeper`` is the retention bookkeeping of the in-memory record store
(``_core.records.MemoryRecords``). It owns no key: it tells the store which records
are due to go, and the store drops them (every method runs under
``Core.lock``; times are given, read from ``Core.clock``). Three orders are
kept, each only when its limit is set:

- ``_ttl``: completed records in the order they completed. With one ``ttl``
  per queue that is also the order they expire in, so expired records are
  popped from the front: amortised O(1) per key, no scan, no thread.
- ``_failed``: failed records likewise, for ``failed_ttl``.
- ``_lru``: completed records from least to most recently used, for
  ``max_completed``.

An entry in ``_ttl`` / ``_failed`` may be stale: its key was claimed again,
forgotten or evicted. ``alive(rec)`` (the map still holds that very record)
tells; a stale one is skipped when it reaches the front. An evicted record
lets go of its output at once, so a stale entry costs a few bytes until its
time comes.

Correctness never waits for a sweep: the store checks a record's own time
against the limits whenever it reads the key (``expired``).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from procq._core.entries import DONE
from procq._model.policies import Retention
from procq._model.values import Completed, Failed, Failure

if TYPE_CHECKING:
    from procq._core.entries import Entry

#: The time of a record kept by a store without time limits (one shared float).
NO_TIME = 0.0

__all__ = ["NO_TIME", "Done", "Fell", "Keeper", "Record"]


class Done:
    """A completed key's record; the stand-in its job's handles hold (see the module docstring).

    While it stands for a live entry, ``output`` holds the entry itself
    (``JobHandle._entry`` tells them apart): the store's one write of the
    job's output at its completion is the switch, so a handle reading without
    the lock sees the entry or the output, never neither, and a record keeps
    its four slots (``bench/memory.py``). A job that fails or is abandoned leaves the entry
    there (handles read the failure from the entry), and so does every job
    of a store whose outcomes wait for a commit before they are given out.
    """

    __slots__ = ("at", "fp", "key", "output")

    #: Read like an ended entry's (``Entry.status``) by whoever a handle gives it to.
    status = DONE

    def __init__(self, key: str, output: Any, fp: bytes | None, at: float) -> None:
        self.key = key
        self.output = output
        self.fp = fp
        self.at = at

    @classmethod
    def standing_for(cls, entry: Entry) -> Done:
        """The stand-in of a live entry, for its handles."""
        return cls(entry.key, entry, None, NO_TIME)

    @property
    def outcome(self) -> Completed[Any]:
        """As an ended entry's ``outcome`` (a handle gives a completed ``Done`` where it gave the entry)."""
        return Completed(self.output)

    def state(self) -> Completed[Any]:
        return Completed(self.output)


class Fell:
    """A failed key's record."""

    __slots__ = ("at", "failure", "fp", "key")

    def __init__(self, key: str, failure: Failure, fp: bytes | None, at: float) -> None:
        self.key = key
        self.failure = failure
        self.fp = fp
        self.at = at

    def state(self) -> Failed:
        return Failed(self.failure)


Record = Done | Fell


class Keeper:
    """Retention bookkeeping for one queue (see the module docstring)."""

    def __init__(self, retention: Retention, alive: Callable[[Record], bool]) -> None:
        self.retention = retention
        self.ttl = retention.ttl
        self.failed_ttl = retention.failed_ttl
        self.max_completed = retention.max_completed
        self.timed = self.ttl is not None or self.failed_ttl is not None
        self.active = retention.bounded
        self._alive = alive
        self._ttl: deque[Done] = deque()
        self._failed: deque[Fell] = deque()
        self._lru: OrderedDict[str, Done] = OrderedDict()

    def expired(self, rec: Record, now: float) -> bool:
        """Has ``rec`` outlived its limit? (Checked on every read of a key.)"""
        if type(rec) is Done:
            return self.ttl is not None and now - rec.at >= self.ttl
        return self.failed_ttl is not None and now - rec.at >= self.failed_ttl

    def added(self, rec: Record) -> list[Record]:
        """``rec`` was stored. Returns records now beyond ``max_completed``,
        least recently used first, for the caller to drop."""
        if type(rec) is Fell:
            if self.failed_ttl is not None:
                self._failed.append(rec)
            return []
        assert type(rec) is Done
        if self.ttl is not None:
            self._ttl.append(rec)
        return self._remember(rec)

    def used(self, rec: Record) -> None:
        """A read of ``rec`` (a push answered from it, a ``state()``)."""
        if type(rec) is Done and self.max_completed is not None and rec.key in self._lru:
            self._lru.move_to_end(rec.key)

    def detached(self, rec: Record) -> None:
        """A claim took ``rec``'s key; ``rec`` may come back (``restored``)
        if the claim is abandoned before it runs."""
        if type(rec) is Done and self.max_completed is not None and self._lru.get(rec.key) is rec:
            del self._lru[rec.key]

    def dropped(self, rec: Record) -> None:
        """``rec`` left the map for good (replaced, forgotten, expired, evicted)."""
        self.detached(rec)
        if type(rec) is Done and self.ttl is not None:
            rec.output = None  # it may wait in _ttl until its time: keep that small

    def restored(self, rec: Record) -> list[Record]:
        """``rec`` is back in the map (an abandoned claim gave the key back).
        Returns records now beyond ``max_completed``, for the caller to drop."""
        if isinstance(rec, Fell):
            if self.failed_ttl is not None:
                _insort(self._failed, rec)
            return []
        if self.ttl is not None:
            _insort(self._ttl, rec)  # may now be in twice: due() drops it once
        return self._remember(rec)

    def _remember(self, rec: Done) -> list[Record]:
        if self.max_completed is None:
            return []
        self._lru[rec.key] = rec
        self._lru.move_to_end(rec.key)
        evicted: list[Record] = []
        while len(self._lru) > self.max_completed:
            _, old = self._lru.popitem(last=False)
            evicted.append(old)
        return evicted

    def due(self, now: float, drop: Callable[[Record], None]) -> None:
        """Drop (through ``drop``, at once) the records whose time is up, from
        the fronts of the time orders; stale entries met on the way are
        discarded."""
        if self.ttl is not None:
            ttl, q = self.ttl, self._ttl
            while q and now - q[0].at >= ttl:
                rec = q.popleft()
                if self._alive(rec):
                    drop(rec)
        if self.failed_ttl is not None:
            fttl, fq = self.failed_ttl, self._failed
            while fq and now - fq[0].at >= fttl:
                frec = fq.popleft()
                if self._alive(frec):
                    drop(frec)

    def check(self, completed: int) -> None:
        """Invariants (for ``Core._check_invariants``); ``completed`` is the
        number of completed keys the map holds."""
        if self.max_completed is not None:
            assert len(self._lru) == completed <= self.max_completed, (len(self._lru), completed)
            for key, rec in self._lru.items():
                assert rec.key == key and self._alive(rec), key
        if self.ttl is not None:
            live = {id(r) for r in self._ttl if self._alive(r)}
            assert len(live) == completed, (len(live), completed)
            assert all(a.at <= b.at for a, b in zip(self._ttl, list(self._ttl)[1:], strict=False))
        if self.failed_ttl is not None:
            assert all(a.at <= b.at for a, b in zip(self._failed, list(self._failed)[1:], strict=False))


def _insort(q: deque[Any], rec: Record) -> None:
    """Put ``rec`` back in time order (from the right: it is usually recent)."""
    i = len(q)
    while i > 0 and q[i - 1].at > rec.at:
        i -= 1
    q.insert(i, rec)
