"""The ended half of the state map: lookups that honour retention, dropping
and forgetting keys, and the snapshot behind ``q.keys()`` / ``q.handles()``.

A mixin of ``Core`` (``_core.py``), split off to keep that module to the
claim / dispatch / finish cycle. The methods use ``Core``'s fields, declared
below for the type checker, and run under ``Core.lock`` unless they take it
themselves (``forget``, ``snapshot``). What is kept for how long is
``_retention.Keeper``'s business; this is where the map acts on it.
"""

from __future__ import annotations

import threading

from procq._entries import PROCESSING, Ended, Entry
from procq._retention import Done, Keeper, Record
from procq._values import Completed, Failed

__all__ = ["EndedKeys"]


class EndedKeys:
    lock: threading.Lock
    keeper: Keeper
    _keys: dict[str, Entry | Record]
    _completed: int
    _failed: int

    def _lookup(self, key: str, now: float) -> Entry | Record | None:
        """The key's entry or record; an expired record is dropped here, so an
        expired key is never answered from the store."""
        current = self._keys.get(key)
        if current is not None and not isinstance(current, Entry) and self.keeper.active:
            if self.keeper.expired(current, now):
                self._drop(current)
                return None
        return current

    def _sweep(self, now: float) -> None:
        """Reclaim the records whose time is up (amortised O(1) per key)."""
        if self.keeper.timed:
            self.keeper.due(now, self._drop)

    def _count(self, rec: Record, n: int) -> None:
        if type(rec) is Done:
            self._completed += n
        else:
            self._failed += n

    def _detach(self, rec: Record) -> None:
        """A claim took ``rec``'s key (it may give it back: ``_abandon``)."""
        self._count(rec, -1)
        self.keeper.detached(rec)

    def _drop(self, rec: Record) -> None:
        """``rec``'s key is forgotten: as if never pushed."""
        if self._keys.get(rec.key) is rec:
            del self._keys[rec.key]
            self._count(rec, -1)
        self.keeper.dropped(rec)

    def forget(self, key: str) -> bool:
        """Drop an ended key. False if the queue holds no such key; raises
        ``ValueError`` for a live one."""
        with self.lock:
            current = self._lookup(key, self.keeper.clock())
            if current is None:
                return False
            if type(current) is Entry:
                state = "running" if current.status == PROCESSING else "pending"
                raise ValueError(
                    f"cannot forget key {key!r}: it is live ({state}); only a key that ended "
                    "(completed or failed) can be forgotten"
                )
            self._drop(current)  # type: ignore[arg-type]
            return True

    def snapshot(self, prefix: str | None, kinds: tuple[type, ...] | None) -> list[Entry | Ended]:
        """Every key (with ``prefix``, in a state of ``kinds``), sorted, as its
        live entry or an ``Ended`` stand-in for its record."""
        found: list[Entry | Ended] = []
        with self.lock:
            now = self.keeper.clock()
            self._sweep(now)
            expired: list[Record] = []
            for key, value in self._keys.items():
                if prefix is not None and not key.startswith(prefix):
                    continue
                if isinstance(value, Entry):
                    if kinds is None or type(value.state()) in kinds:
                        found.append(value)
                    continue
                if self.keeper.active and self.keeper.expired(value, now):
                    expired.append(value)
                    continue
                cls = Completed if type(value) is Done else Failed
                if kinds is None or cls in kinds:
                    found.append(Ended(key, value.state()))
            for rec in expired:
                self._drop(rec)
        found.sort(key=lambda e: e.key)
        return found

