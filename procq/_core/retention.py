"""What the state map keeps of a key that ended, and for how long.

A key that ended is stored as a small record: ``Done`` (its output) or
``Fell`` (its failure), with the job's fingerprint and the time it ended,
in that order, so that ``rec[KEY]``, ``rec[FP]`` and ``rec[AT]`` read either.

A ``Done`` is a plain tuple, ``(key, output, fp, at)``, and not an object of
a class of its own, because of the garbage collector: the collector stops
tracking a tuple that holds only untracked values (strings, numbers, bytes,
None, such tuples), and then a dict that holds only such tuples. A queue
that keeps a million completed keys with plain outputs is then a million
objects the collector never walks, where records of a class were a million
it walked at every full collection (300,000 kept keys: 130 ms a collection,
stopping every supervisor thread; ``bench/gc_keys.py`` measures it). An
output the collector does track (a list, an object) keeps its record
tracked: the output itself is walked either way. A ``Fell`` holds a
``Failure`` (always tracked), so it is a named tuple, read by name.

The handles on a job hold neither: they hold the entry's stand-in
(``_core.entries.Face``), which the store completes with the output.

``Keeper`` is the retention bookkeeping of the in-memory record store
(``_core.records.MemoryRecords``). It owns no key: it tells the store which records
are due to go, and the store drops them (every method runs under
``Core.lock``; times are given, read from ``Core.clock``). Three orders are
kept, each only when its limit is set:

- ``_ttl``: completed keys in the order they completed, as ``(at, key)``.
  With one ``ttl`` per queue that is also the order they expire in, so
  expired records are popped from the front: amortised O(1) per key, no
  scan, no thread.
- ``_failed``: failed keys likewise, for ``failed_ttl``.
- ``_lru``: completed records from least to most recently used, for
  ``max_completed``.

An entry in ``_ttl`` / ``_failed`` may be stale: its key was claimed again,
forgotten or evicted. The store's ``current(key, at)`` (the record it holds
for the key, if it ended at that time) tells; a stale one is skipped when it
reaches the front. It holds no output, so it costs a few bytes until its
time comes.

Correctness never waits for a sweep: the store checks a record's own time
against the limits whenever it reads the key (``expired``).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from procq._model.policies import Retention
from procq._model.values import Completed, Failed, Failure

#: The time of a record kept by a store without time limits (one shared float).
NO_TIME = 0.0

__all__ = ["AT", "FP", "KEY", "NO_TIME", "OUTPUT", "Done", "Fell", "Keeper", "Record", "record_state"]

#: A completed key's record: ``(key, output, fp, at)``, an exact tuple (see the module docstring).
Done = tuple[str, Any, "bytes | None", float]
#: Where a record holds its key, its job's fingerprint and when it ended (``Done`` and ``Fell``
#: alike), and a ``Done`` its output.
KEY: Final = 0
OUTPUT: Final = 1
FP: Final = 2
AT: Final = 3


class Fell(NamedTuple):
    """A failed key's record."""

    key: str
    failure: Failure
    fp: bytes | None
    at: float


Record = Done | Fell


def record_state(rec: Record) -> Completed[Any] | Failed:
    """The key's state, as its record tells it."""
    if type(rec) is tuple:
        return Completed(rec[OUTPUT])
    return Failed(rec.failure)  # type: ignore[union-attr]


class Keeper:
    """Retention bookkeeping for one queue (see the module docstring)."""

    def __init__(self, retention: Retention, current: Callable[[str, float], Record | None]) -> None:
        self.retention = retention
        self.ttl = retention.ttl
        self.failed_ttl = retention.failed_ttl
        self.max_completed = retention.max_completed
        self.timed = self.ttl is not None or self.failed_ttl is not None
        self.active = retention.bounded
        self._current = current
        self._ttl: deque[tuple[float, str]] = deque()
        self._failed: deque[tuple[float, str]] = deque()
        self._lru: OrderedDict[str, Done] = OrderedDict()

    def expired(self, rec: Record, now: float) -> bool:
        """Has ``rec`` outlived its limit? (Checked on every read of a key.)"""
        limit = self.ttl if type(rec) is tuple else self.failed_ttl
        return limit is not None and now - rec[AT] >= limit

    def added(self, rec: Record) -> list[Record]:
        """``rec`` was stored. Returns records now beyond ``max_completed``,
        least recently used first, for the caller to drop."""
        if type(rec) is Fell:
            if self.failed_ttl is not None:
                self._failed.append((rec.at, rec.key))
            return []
        if self.ttl is not None:
            self._ttl.append((rec[AT], rec[KEY]))
        return self._remember(rec)

    def used(self, rec: Record) -> None:
        """A read of ``rec`` (a push answered from it, a ``state()``)."""
        if type(rec) is tuple and self.max_completed is not None and rec[KEY] in self._lru:
            self._lru.move_to_end(rec[KEY])

    def detached(self, rec: Record) -> None:
        """A claim took ``rec``'s key; ``rec`` may come back (``restored``)
        if the claim is abandoned before it runs."""
        if type(rec) is tuple and self.max_completed is not None and self._lru.get(rec[KEY]) is rec:
            del self._lru[rec[KEY]]

    def dropped(self, rec: Record) -> None:
        """``rec`` left the map for good (replaced, forgotten, expired, evicted)."""
        self.detached(rec)

    def restored(self, rec: Record) -> list[Record]:
        """``rec`` is back in the map (an abandoned claim gave the key back).
        Returns records now beyond ``max_completed``, for the caller to drop."""
        if type(rec) is Fell:
            if self.failed_ttl is not None:
                _insort(self._failed, (rec.at, rec.key))
            return []
        if self.ttl is not None:
            _insort(self._ttl, (rec[AT], rec[KEY]))  # may now be in twice: due() drops it once
        return self._remember(rec)

    def _remember(self, rec: Done) -> list[Record]:
        if self.max_completed is None:
            return []
        self._lru[rec[KEY]] = rec
        self._lru.move_to_end(rec[KEY])
        evicted: list[Record] = []
        while len(self._lru) > self.max_completed:
            _, old = self._lru.popitem(last=False)
            evicted.append(old)
        return evicted

    def due(self, now: float, drop: Callable[[Record], None]) -> None:
        """Drop (through ``drop``, at once) the records whose time is up, from
        the fronts of the time orders; stale entries met on the way are
        discarded."""
        current = self._current
        kinds: tuple[tuple[float | None, deque[tuple[float, str]], type], ...] = (
            (self.ttl, self._ttl, tuple),
            (self.failed_ttl, self._failed, Fell),
        )
        for limit, q, kind in kinds:
            if limit is None:
                continue
            while q and now - q[0][0] >= limit:
                at, key = q.popleft()
                rec = current(key, at)
                if type(rec) is kind:
                    drop(rec)  # type: ignore[arg-type]

    def check(self, completed: int) -> None:
        """Invariants (for ``Core._check_invariants``); ``completed`` is the
        number of completed keys the map holds."""
        if self.max_completed is not None:
            assert len(self._lru) == completed <= self.max_completed, (len(self._lru), completed)
            for key, rec in self._lru.items():
                assert rec[KEY] == key and self._current(key, rec[AT]) is rec, key
        if self.ttl is not None:
            live = {key for at, key in self._ttl if type(self._current(key, at)) is tuple}
            assert len(live) == completed, (len(live), completed)
            assert all(a[0] <= b[0] for a, b in zip(self._ttl, list(self._ttl)[1:], strict=False))
        if self.failed_ttl is not None:
            assert all(a[0] <= b[0] for a, b in zip(self._failed, list(self._failed)[1:], strict=False))


def _insort(q: deque[tuple[float, str]], item: tuple[float, str]) -> None:
    """Put ``item`` back in time order (from the right: it is usually recent)."""
    i = len(q)
    while i > 0 and q[i - 1][0] > item[0]:
        i -= 1
    q.insert(i, item)
