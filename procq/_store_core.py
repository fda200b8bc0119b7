"""The core of a queue opened on a store: ``StoreCore``, a ``Core`` whose
claims go through the store's database and whose ended keys live there.

Where the in-memory core keeps ended keys in ``MemoryRecords``, this one keeps
them as rows (``_store``). Live keys stay ``Entry`` objects in the state map
as always, and a live row (``holder`` = this queue) stands for each of them,
so other queues join them. Consistency between the two rests on one rule:
**every statement this queue runs on its database connection runs under
``Core.lock``** (the claim's transaction, and the outcome writes):

- a claim (``claim``, ``claim_all``) looks at the live map, then decides on
  the key's row in one write transaction (``_store.decide``), then claims in
  the state map, all in one critical section: no other thread of this queue
  can see the row and the map disagree;
- ``StoreRecords`` (the ``KeyRecords`` of this core) turns the state map's
  record operations into row writes: an outcome (``record``), a claim given
  back (``give_back``: the row it replaced is put back). They are batched:
  queued while the lock is held and committed in one transaction when the
  lock is released (``StoreLock``), **before** the wake-ups of the jobs they
  settle run (every core method runs its wake-ups after the lock). So no
  waiter is told of an outcome that is not yet durable, and a worker's batch
  of reports is one commit. A write the store refuses (it is gone) is kept
  and retried by the watcher (``_store_remote``).

Holding the lock over a database statement is a deliberate exception to the
core's rule of no I/O under its lock: the connection is this queue's one
connection, and the lock is what serialises its use. A push that finds the
database gone raises ``StoreUnavailable`` and changes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from procq._core import Core
from procq._entries import ABANDONED, Ended, Entry, LaneState
from procq._job import Job, Lane, Retention
from procq._statemap import CACHED, FAILED, INFLIGHT, Claim, conflict, new_claim
from procq._store import (
    Conn,
    Found,
    Row,
    Store,
    StoreUnavailable,
    Tx,
    decide,
    holder_id,
    interrupted,
    open_store,
    stable_fingerprint,
)
from procq._store_records import Held, Op, StoreLock, StoreRecords, as_record
from procq._store_remote import RemoteEntry, Watcher
from procq._values import State

__all__ = ["StoreCore"]

log = logging.getLogger("procq.store")


class StoreCore(Core):
    """A ``Core`` whose keys are shared through a store (see the module docstring)."""

    def __init__(
        self,
        lanes: dict[str, Lane],
        retention: Retention | None,
        reuse: str,
        check_payload: bool,
        strict_payload: bool,
        store: Any,
    ) -> None:
        self.store: Store = open_store(store)
        self.holder = holder_id()
        self.conn = self.store.connect()
        try:
            self.conn.renew(self.holder, self.store.lease)
            self.watcher = Watcher(self)
        except BaseException:
            self.conn.close()
            raise
        self.retention = retention or Retention()
        self.records_ = StoreRecords(self)
        self._runs = 0
        self._tx: Tx | None = None  # the write transaction open under the lock, if any
        self._refused: list[tuple[str, Op]] = []  # writes the store refused, to retry
        super().__init__(lanes, retention, reuse, check_payload, strict_payload, records=self.records_)
        self._lock = StoreLock(self._flush)
        self.lock = self._lock  # type: ignore[assignment]
        self.watcher.start()

    # --- writes ---------------------------------------------------------------------

    def write(self, key: str, op: Op) -> None:
        """Queue a row write (under the lock); it commits when the lock is released."""
        if self._tx is not None:
            op(self._tx)
        else:
            self._lock.pending.append((key, op))

    def _flush(self) -> None:
        """Commit the queued writes, and any the store refused before (under the lock)."""
        pending = self._lock.pending
        ops = self._refused + pending
        pending.clear()
        self._refused = []
        if not ops:
            return
        try:
            with self.conn.write(sorted({k for k, _ in ops})) as tx:
                for _, op in ops:
                    op(tx)
        except StoreUnavailable as exc:
            log.warning("procq store %s: %d outcome writes wait for it: %s", self.store.url, len(ops), exc)
            self._refused = ops

    def flush_refused(self) -> None:
        """Retry the writes the store refused (the watcher calls it)."""
        with self.lock:
            if self._refused:
                self._flush()

    # --- claiming ---------------------------------------------------------------------

    def claim(self, job: Job[Any], lane: LaneState, fp: bytes | None = None, due: float | None = None) -> Claim:
        key = job.key
        reuse = job.reuse or self.keys.reuse
        with self.lock:
            now = self.clock()
            if self.keys.closing or key in self.keys.live:
                return self.keys.claim(job, lane, fp, due, now)  # QueueClosed, or joins the live entry
            row = self.conn.read(key)
            if row is not None and row.state == "done" and reuse != "always" and not self.row_expired(row):
                return new_claim(Claim, (CACHED, row.outcome().output, self._conflict(row, job)))  # type: ignore[union-attr]
            with self.conn.write([key]) as tx:
                self._tx = tx
                try:
                    return self._claim(tx, job, lane, fp, due, now)
                finally:
                    self._tx = None

    def claim_all(
        self, items: list[tuple[Job[Any], LaneState, bytes | None, float | None]]
    ) -> tuple[list[Claim], int | None]:
        """As ``Core.claim_all``, in one transaction of the store."""
        claims: list[Claim] = []
        fresh: list[Entry] = []
        conflict_at: int | None = None
        with self.lock:
            now = self.clock()
            with self.conn.write(sorted({job.key for job, _, _, _ in items})) as tx:
                self._tx = tx
                try:
                    for i, (job, lane, fp, due) in enumerate(items):
                        if self.keys.closing or job.key in self.keys.live:
                            claim = self.keys.claim(job, lane, fp, due, now)
                        else:
                            claim = self._claim(tx, job, lane, fp, due, now)
                        if claim.conflict is not None and conflict_at is None:
                            conflict_at = i
                            if self.strict_payload:
                                for entry in reversed(fresh):
                                    self.keys.abandon(entry, "its batch was refused", now)
                                    self.records_.abandoned(entry)
                                claims.append(claim)
                                return claims, conflict_at
                        if claim.kind == "queued":
                            fresh.append(claim.value)
                        claims.append(claim)
                finally:
                    self._tx = None
        return claims, conflict_at

    def _claim(self, tx: Tx, job: Job[Any], lane: LaneState, fp: bytes | None, due: float | None, now: float) -> Claim:
        key = job.key
        self._runs += 1
        run = f"{self.holder}/{self._runs}"
        wall = time.time()
        not_before = None if due is None else wall + max(0.0, due - now)

        sfp = stable_fingerprint(job) if self.check_payload else None

        def make(prev: Row | None) -> Row:
            return Row(key, "live", run, self.holder, sfp, None, None, None, 1, not_before, wall, None)

        found, row = decide(tx, key, job.reuse or self.keys.reuse, self.holder, make, False, self.row_expired)
        if found is Found.CACHED:
            assert row is not None
            return new_claim(Claim, (CACHED, row.outcome().output, self._conflict(row, job)))  # type: ignore[union-attr]
        if found is Found.FAILED:
            assert row is not None
            return new_claim(Claim, (FAILED, row.outcome().failure, self._conflict(row, job)))  # type: ignore[union-attr]
        if found is Found.REMOTE:
            assert row is not None
            return new_claim(Claim, (INFLIGHT, RemoteEntry(key, row.run, row.holder), self._conflict(row, job)))
        held = Held(run, row, lane.spec.trusted)
        self.records_.held[key] = held
        self.records_.found = as_record(row)
        claim = self.keys.claim(job, lane, fp, due, now)
        held.entry = claim.value
        return claim

    def _conflict(self, row: Row, job: Job[Any]) -> tuple[str, Any] | None:
        if not self.check_payload or row.fp is None:
            return None
        return conflict(row.fp, stable_fingerprint(job), None)

    # --- abandoned claims: rows that must go ---------------------------------------------

    def abandon_all(self, entries: list[Entry], why: str) -> None:
        super().abandon_all(entries, why)
        self._forget_abandoned(entries)

    def unblock(self, entry: Entry, why: str) -> Any:
        answer = super().unblock(entry, why)
        self._forget_abandoned([entry])
        return answer

    def cancel_all(self, why: str) -> list[Any]:
        doomed = super().cancel_all(why)
        with self.lock:
            self._forget_abandoned_locked([h.entry for h in self.records_.held.values() if h.entry is not None])
        return doomed

    def _forget_abandoned(self, entries: list[Entry]) -> None:
        with self.lock:
            self._forget_abandoned_locked(entries)

    def _forget_abandoned_locked(self, entries: list[Entry]) -> None:
        for entry in entries:
            if entry.status is ABANDONED:
                self.records_.abandoned(entry)

    def wake(self, entry: Any, target: float) -> Any:
        if type(entry) is RemoteEntry:
            return None  # the holder's queue alone moves its timers
        return super().wake(entry, target)

    # --- waiting on another queue's key ------------------------------------------------

    def wait_event(self, entry: Any) -> threading.Event | None:
        if type(entry) is RemoteEntry:
            self._watch(entry)
        return super().wait_event(entry)

    def add_callback(self, entry: Any, callback: Callable[[], None]) -> bool:
        if type(entry) is RemoteEntry:
            self._watch(entry)
        return super().add_callback(entry, callback)

    def _watch(self, entry: RemoteEntry) -> None:
        """Watch ``entry`` from now on, then read its row once: an end the
        watcher could have missed (before it watched) is seen here."""
        if entry.outcome is not None:
            return
        self.watcher.watch(entry)
        with self.lock:
            row = self.conn.read(entry.key)
        if row is not None and row.state != "live":
            self.watcher.resolve(entry, row.outcome())

    # --- reading ----------------------------------------------------------------------

    def row_expired(self, row: Row) -> bool:
        """Is an ended row past the queue's retention? (Checked at every read; ``sweep_rows`` deletes them.)"""
        if row.ended is None:
            return False
        limit = self.retention.ttl if row.state == "done" else self.retention.failed_ttl
        return limit is not None and time.time() - row.ended >= limit

    def sweep_rows(self, conn: Conn | None = None) -> int:
        """Delete the rows past the retention, on ``conn`` (the watcher's, every
        third of a lease) or on the queue's own, under the lock."""
        r = self.retention
        if r.ttl is None and r.failed_ttl is None and r.max_completed is None:
            return 0
        if conn is not None:
            return conn.purge(r.ttl, r.failed_ttl, r.max_completed)
        with self.lock:
            return self.conn.purge(r.ttl, r.failed_ttl, r.max_completed)

    def _row_state(self, row: Row, dead: set[str]) -> State | RemoteEntry | None:
        if row.state != "live":
            return None if self.row_expired(row) else row.outcome()
        if row.holder == self.holder:
            return None  # a claim of this queue that is not live any more: its row is on its way out
        if row.holder in dead:
            return interrupted(row).outcome()
        return RemoteEntry(row.key, row.run, row.holder)

    def state(self, key: str) -> State | None:
        with self.lock:
            entry = self.keys.live.get(key)
            if entry is not None:
                return entry.state()
            row = self.conn.read(key)
            if row is None:
                return None
            found = self._row_state(row, self.conn.dead_holders() if row.state == "live" else set())
            return found.state() if type(found) is RemoteEntry else found  # type: ignore[return-value]

    def snapshot(self, prefix: str | None, kinds: tuple[type, ...] | None) -> list[Any]:
        with self.lock:
            live = self.keys.live
            found: list[Any] = [e for k, e in live.items() if prefix is None or k.startswith(prefix)]
            rows = [r for r in self.conn.scan(prefix) if r.key not in live]
            dead = self.conn.dead_holders() if any(r.state == "live" for r in rows) else set()
            for row in rows:
                got = self._row_state(row, dead)
                if got is None:
                    continue
                found.append(got if type(got) is RemoteEntry else Ended(row.key, got))  # type: ignore[arg-type]
        if kinds is not None:
            found = [e for e in found if type(e.state()) in kinds]
        found.sort(key=lambda e: e.key)
        return found

    def forget(self, key: str) -> bool:
        with self.lock:
            now = self.clock()
            if key in self.keys.live:
                return self.keys.forget(key, now)  # raises: a live key
            row = self.conn.read(key)
            if row is None:
                return False
            if row.state == "live" and row.holder != self.holder and row.holder not in self.conn.dead_holders():
                raise ValueError(
                    f"cannot forget key {key!r}: it is live in another queue; only a key that ended "
                    "(completed or failed) can be forgotten"
                )
            with self.conn.write([key]) as tx:
                return tx.delete(key, row.run)

    # --- closing ------------------------------------------------------------------------

    def close_store(self) -> None:
        """The queue closed: commit what is left, give up the lease, let go of the database."""
        self.watcher.stop()
        with self.lock:
            self._flush()
        try:
            self.conn.release(self.holder)
        except StoreUnavailable as exc:
            log.warning("procq store %s: the lease is left to expire: %s", self.store.url, exc)
        if self._refused:
            log.error("procq store %s: %d outcomes could not be written", self.store.url, len(self._refused))
        self.conn.close()
