"""The ended-key records of a queue on a store (``StoreRecords``, its
``KeyRecords``): the state map's record operations become queued row writes
(``_durable.commit``); see ``_durable.core`` for how they keep the database and
the state map in step.

A key this queue claimed is *held* here from its claim until its outcome's
row is committed: first in ``held`` (live), then in ``ending`` (ended, its row
queued). Every other thread of the queue learns of the end only at that
commit (``StoreCore.settled``), and a push of the key meanwhile joins it:
for everyone, the job ends when its row is durable."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from procq._core.entries import ABANDONED, Entry, Face
from procq._core.retention import KEY, Fell, Record
from procq._durable.commit import Write
from procq._model.policies import Retention
from procq._model.values import Completed, Failed, Failure
from procq._stores.base import Conn, Row, encode_outcome

if TYPE_CHECKING:
    from procq._durable.core import StoreCore

__all__ = ["Held", "StoreRecords", "as_record", "row_expired", "sweep_rows"]


class Held:
    """What this queue's claim of a key needs to write the key's row later."""

    __slots__ = ("encoded", "entry", "live", "prev", "trusted")

    def __init__(self, live: Row, prev: Row | None, trusted: bool) -> None:
        self.live = live  # the claim's live row
        self.prev = prev  # the row the claim replaced, put back if it is abandoned
        self.trusted = trusted
        self.entry: Entry | None = None
        # The job's outcome and its row's (state, output, encoding, failure),
        # readied off the lock (``_durable.outputs``), or None.
        self.encoded: tuple[Completed[Any], tuple[str, bytes | None, str | None, str | None]] | None = None


class StoreRecords:
    """``KeyRecords`` over a store's rows, for ``StoreCore`` (see the module docstring).

    ``lookup`` answers only the state map's claim that ``StoreCore`` is making:
    the row that claim replaces, as a record. Every other read goes to the
    database through ``StoreCore``'s own methods.
    """

    expires = True  # never read a record without the lock
    timed = False

    def __init__(self, core: StoreCore) -> None:
        self._core = core
        # This queue's claims: live ones, and ended ones whose row is not yet
        # committed (``committed`` drops them). A claim moves from the first to
        # the second at its end, added there before it leaves ``held`` (read
        # without the lock: see ``StoreCore.settled``). Invariant: a key of
        # ``ending`` is not live, and has its ended row queued.
        self.held: dict[str, Held] = {}
        self.ending: dict[str, Held] = {}
        self.found: Record | None = None  # for the claim being made
        self.counts = (0, 0)  # rows done and failed, as last read

    def holds(self, entry: Any) -> bool:
        """Is ``entry``'s claim still held here (live, or its ended row not yet
        committed)? Read without the lock: ``held`` first, then ``ending``,
        the reverse of the order in which a claim goes from one to the other."""
        key = entry.key
        held = self.held.get(key)
        if held is not None and held.entry is entry:
            return True
        held = self.ending.get(key)
        return held is not None and held.entry is entry

    @property
    def completed(self) -> int:  # read from the database by StoreCore.stats, just before
        return self.counts[0]

    @completed.setter
    def completed(self, n: int) -> None:  # the counts are the database's
        pass

    @property
    def failed(self) -> int:
        return self.counts[1]

    @failed.setter
    def failed(self, n: int) -> None:
        pass

    def peek(self, key: str) -> Record | None:
        return None

    def lookup(self, key: str, now: float) -> Record | None:
        rec, self.found = self.found, None
        return rec

    def used(self, rec: Record) -> None:
        pass

    def take(self, rec: Record) -> None:
        pass

    def give_back(self, rec: Record, now: float) -> None:
        held = self.held.pop(rec[KEY], None)
        if held is not None:
            self._core.commits.add(rec[KEY], _restore(held))

    def release(self, rec: Record) -> None:
        held = self.held.get(rec[KEY])
        if held is not None:
            held.prev = None

    def record(
        self, key: str, outcome: Completed[Any] | Failed, fp: bytes | None, now: float, face: Face | None = None
    ) -> None:
        # ``face`` is left as it is: an outcome is given out once its row is committed
        # (``StoreCore.settled`` knows the entry, not its stand-in), so handles keep the entry.
        held = self.held.get(key)
        if held is None:
            return
        if held.entry is not None:
            self.ending[key] = held  # (first: the claim is never in neither; see StoreCore.settled)
        del self.held[key]
        attempts = held.entry.attempt if held.entry is not None else 1
        try:
            ready, held.encoded = held.encoded, None
            if ready is not None and ready[0] is outcome:
                state, output, encoding, failure = ready[1]
            else:
                state, output, encoding, failure = encode_outcome(outcome, held.trusted)
        except Exception as exc:  # an output that cannot be stored: the row says why
            why = Failure("error", f"job {key!r}: its output could not be stored: {exc!r}", exc_type=type(exc).__name__)
            state, output, encoding, failure = encode_outcome(Failed(why), True)
        ended = held.live._replace(state=state, holder=None, output=output, encoding=encoding,
                                   failure=failure, attempts=attempts, ended=time.time())  # fmt: skip
        self._core.commits.add(key, ended)

    def committed(self, rows: list[Row]) -> None:
        """These ended rows are committed: their claims are no longer held (under ``Core.lock``)."""
        ending = self.ending
        for row in rows:
            held = ending.get(row.key)
            if held is not None and held.live.run == row.run:
                del ending[row.key]

    def abandoned(self, entries: Iterable[Entry | None]) -> None:
        """Of ``entries``, the claims abandoned: their rows go, or the rows
        they replaced come back (under ``Core.lock``)."""
        for entry in entries:
            if entry is not None and entry.status is ABANDONED and (held := self._release(entry)) is not None:
                self._core.commits.add(entry.key, _restore(held))

    def rolled_back(self, entries: Iterable[Entry]) -> None:
        """Claims whose transaction rolled back: their rows went with it (under ``Core.lock``)."""
        for entry in entries:
            self._release(entry)

    def _release(self, entry: Entry) -> Held | None:
        """Let go of the key's claim, if it is ``entry``'s."""
        held = self.held.get(entry.key)
        if held is None or held.entry is not entry:
            return None
        return self.held.pop(entry.key)

    def drop(self, rec: Record) -> None:
        pass

    def sweep(self, now: float) -> None:
        pass

    def scan(self, prefix: str | None, now: float, completed: bool, failed: bool) -> list[Record]:
        return []

    def check(self) -> None:
        for key, held in self.held.items():
            assert held.entry is None or held.entry.key == key, key
        live = self._core.keys.live
        for key, held in self.ending.items():
            assert held.entry is not None and held.entry.key == key and held.entry.outcome is not None, key
            assert key not in live and key not in self.held, key


def _restore(held: Held) -> Write:
    """The write that takes back a claim: its row goes, or the row it replaced comes back."""
    prev, key, run = held.prev, held.live.key, held.live.run

    def write(conn: Conn) -> None:
        if prev is None:
            conn.delete(key, run)
        else:
            conn.restore(key, run, prev)

    return write


def as_record(row: Row | None) -> Record | None:
    if row is None or row.state == "live":
        return None
    outcome = row.outcome()
    if type(outcome) is Completed:
        return (row.key, outcome.output, row.fp, 0.0)
    return Fell(row.key, outcome.failure, row.fp, 0.0)  # type: ignore[union-attr]


# --- rows past the queue's retention ------------------------------------------------


def row_expired(retention: Retention, row: Row) -> bool:
    """Is an ended row past the queue's retention? (Checked at every read; ``sweep_rows`` deletes them.)"""
    if row.ended is None:
        return False
    limit = retention.ttl if row.state == "done" else retention.failed_ttl
    return limit is not None and time.time() - row.ended >= limit


def sweep_rows(core: StoreCore, conn: Conn | None = None) -> int:
    """Delete the rows past ``core``'s retention, on ``conn`` (the watcher's,
    every third of a lease) or on the queue's own; returns how many."""
    r = core.retention
    if r.ttl is None and r.failed_ttl is None and r.max_completed is None:
        return 0
    if conn is not None:
        return conn.purge(r.ttl, r.failed_ttl, r.max_completed)
    with core.db_lock:
        wakeups = core.commit()  # (the purge commits batches of its own)
        deleted = core.conn.purge(r.ttl, r.failed_ttl, r.max_completed)
    core.deliver_now(wakeups)
    return deleted
