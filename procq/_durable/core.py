"""The core of a queue opened on a store: ``StoreCore``, a ``Core`` whose
claims go through the store's database and whose ended keys live there.

Where the in-memory core keeps ended keys in ``MemoryRecords``, this one keeps
them as rows (``_stores.base``). Live keys stay ``Entry`` objects in the state map
as always, and a live row (``holder`` = this queue) stands for each of them,
so other queues join them.

Locks: ``db_lock`` (re-entrant) serialises the queue's one database
connection, and is taken *before* ``Core.lock``, never while holding it; no
statement runs under ``Core.lock``. A push, under ``db_lock`` throughout:

1. under ``Core.lock`` (``_claim_here``): a key this queue holds is joined:
   a live key, as in memory, or one whose job ended with its row not yet
   committed (``StoreRecords.ending``): for every thread of the queue a job
   ends when its row is durable, and the handle resolves at that commit;
2. a key not held here: its queued writes, if any (a claim given back), are
   made in the transaction first (``_settle_here``); then its row is claimed
   (``Conn.claim``, judged by ``_stores.base.judge``) in the group transaction
   (``_durable.commit``); where that transaction holds every key (SQLite), a
   key with no row is claimed by a read, its row queued (``Fresh``);
3. under ``Core.lock`` again: a fresh claim enters the state map.

So the row read in 2 is never behind the state map: only a claim (under
``db_lock``) makes a key live here, so a key not held at 1 stays so until 3,
and no write of it can be queued meanwhile (only a held key ends or is given
back). A claim meets its own queue's live row only where that queue lost the
claim's writes, and then the row is rightly judged interrupted.

Outcomes and given-back claims are queued writes (``StoreRecords``), committed
by the ``Committer`` before the wake-ups they released (``deliver``). A push
that finds the database gone raises ``StoreUnavailable`` and changes nothing.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from procq._core.core import Core, Item
from procq._core.entries import Entry, LaneState, Wakeup, run_wakeups
from procq._core.statemap import CACHED, FAILED, INFLIGHT, Claim, conflict, new_claim
from procq._durable.commit import Commits, Committer, Fresh, commit_claims, commit_writes, run_writes
from procq._durable.outputs import Outputs
from procq._durable.read import forget_key, read_snapshot, read_state
from procq._durable.records import Held, StoreRecords, as_record, row_expired
from procq._durable.remote import RemoteEntry, Watcher
from procq._model.job import Job, Lane
from procq._model.policies import Retention
from procq._model.values import Completed, Failed, State
from procq._stores.base import (
    Conn,
    Found,
    Row,
    Store,
    StoreUnavailable,
    Taken,
    decode_output,
    holder_gone,
    holder_id,
    judge,
    stable_fingerprint,
)
from procq._stores.urls import open_store
from procq._wire.fingerprint import job_fingerprint

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
        self.conn: Conn = self.store.connect()
        self.db_lock = threading.RLock()
        self.commits = Commits()
        self.group_since: float | None = None  # when the open group transaction began (monotonic)
        self.in_user_tx = False  # a ``q.transaction()`` has the connection (under db_lock)
        self.scheduled: set[str] = set()  # keys claimed with a not_before, for the watcher's wakes
        self.retention = retention or Retention()
        self.records_ = StoreRecords(self)
        self._runs = itertools.count(1)
        try:
            self.conn.renew(self.holder, self.store.lease)
            super().__init__(lanes, retention, reuse, check_payload, strict_payload, records=self.records_)
            self.watcher = Watcher(self)
            self.committer = Committer(self)
            self.outputs = Outputs(self)
        except BaseException:
            self.conn.close()
            raise
        self.watcher.start()
        self.committer.start()

    # --- durability: writes, commits, wake-ups ------------------------------------------

    def deliver(self, wakeups: list[Wakeup]) -> None:
        """Wake-ups wait for the writes made before them (see ``_durable.commit``),
        except once the queue is cancelling: then nothing waits for the store."""
        if wakeups and (self.keys.cancelled or not self.commits.hold(wakeups)):
            run_wakeups(wakeups)

    deliver_now = staticmethod(run_wakeups)  # wake-ups whose writes are committed

    def commit(self) -> list[Wakeup]:
        """Run the queued writes and commit them with the group transaction;
        returns the wake-ups released, for the caller to deliver (``deliver_now``)."""
        return commit_writes(self)

    def _begin(self) -> None:
        """Open the group transaction if none is (under db_lock)."""
        if not self.conn.in_tx:
            self.conn.begin()
            self.group_since = time.monotonic()
            self.committer.notice()

    def _settle_keys(self, keys: list[str]) -> list[Wakeup]:
        """Before a read (under db_lock): commit the queued writes of ``keys`` (in a ``q.transaction()``: make them)."""
        counts = self.commits.keys
        if not any(counts.get(k) for k in keys):
            return []
        if self.in_user_tx:
            self._settle_here(keys)
            return []
        wakeups = self.commit()  # (writes queued meanwhile came after the read began: it need not see them)
        if self.commits.refused_since is not None:
            raise StoreUnavailable(
                f"the store {self.store.url} cannot be written now: earlier outcomes of these keys wait for it"
            )
        return wakeups

    def _settle_here(self, keys: list[str]) -> None:
        """Make the queued writes of ``keys`` in the open transaction (under
        db_lock), for a claim or a read in it to see them. They stay queued
        and are made again with the group, changing nothing then: each write
        is guarded by its claim's ``run``."""
        writes = [w for k in keys if self.commits.keys.get(k) for w in self.commits.for_key(k)]
        if writes:
            self._begin()
            run_writes(self.conn, writes)

    def _lost(self) -> None:
        """The store failed under a claim (db_lock held): drop the group transaction."""
        self.conn.rollback()
        self.group_since = None

    # --- claiming -----------------------------------------------------------------------

    def claim(self, job: Job[Any], lane: LaneState, due: float | None = None) -> Claim:
        key = job.key
        if self._read_first() and (job.reuse or self.keys.reuse) != "always" and not self.commits.keys.get(key):
            # The common answer of a store, a completed key: one read, no lock of the core.
            # (A key live here, or claimed by another thread meanwhile, has no done row
            # unless reuse="always", which does not come this way.)
            with self.db_lock:
                done = self.conn.read_done(key)
            if done is not None and (self.retention.ttl is None or time.time() - done[3] < self.retention.ttl):
                output, encoding, held_fp, _ = done
                cached = decode_output(output, encoding)
                differs = None
                if self.check_payload and held_fp is not None:
                    differs = conflict(held_fp, stable_fingerprint(job), None)
                if differs is None or not self.strict_payload:
                    lane.count_cached()  # (no lock of the core here: see _metrics)
                return new_claim(Claim, (CACHED, cached, differs))
            claims, _ = self.claim_all([(job, lane, due)], read=False)  # (read just now: no done row)
            return claims[0]
        claims, _ = self.claim_all([(job, lane, due)])
        return claims[0]

    def claim_all(self, items: list[Item], read: bool = True) -> tuple[list[Claim], int | None]:
        """As ``Core.claim_all``, through the store: one transaction holds
        every key of the batch until it commits. ``read``: see ``_claim``."""
        claims: list[Claim] = []
        fresh: list[Entry] = []
        conflict_at: int | None = None
        wakeups: list[Wakeup] = []
        keys = [job.key for job, _, _ in items]
        fps = [job_fingerprint(job) if self.check_payload else None for job, _, _ in items]
        with self.db_lock:
            try:
                taken: dict[str, tuple[Row, Taken | tuple[Row, bool]]] = {}
                if len(items) > 1:
                    if not self.in_user_tx and not self.store.read_first:
                        wakeups += self.commit()  # hold no key of ours while waiting for the batch's
                    self._begin()
                    self.conn.lock_all(keys)
                    taken = self._claim_held(items)
                for i, ((job, lane, due), fp) in enumerate(zip(items, fps, strict=True)):
                    claim = self._claim_here(job, lane, fp, due)
                    if claim is None:
                        ahead = taken.pop(job.key, None)
                        if ahead is None:
                            self._settle_here([job.key])
                        claim, more = self._claim(job, lane, fp, due, read, ahead)
                        wakeups += more
                    if claim.conflict is not None and conflict_at is None:
                        conflict_at = i
                        if self.strict_payload:
                            if taken:  # claims made ahead: the batch's transaction holds nothing else
                                self._lost()
                                self.rolled_back(fresh, "its batch was refused")
                            else:
                                self.abandon_all(fresh, "its batch was refused")
                            claims.append(claim)
                            break
                    if claim.kind == "queued":
                        fresh.append(claim.value)
                    claims.append(claim)
            except StoreUnavailable:
                if not self.in_user_tx:
                    self._lost()
                self.abandon_all(fresh, "the store could not be reached")
                raise
            except BaseException:
                # Cut short (the queue began closing between two of its keys,
                # say): the batch claims none of them, as in memory.
                if taken:  # claims made ahead, not reached: the batch's transaction holds nothing else
                    self._lost()
                    self.rolled_back(fresh, "its batch was cut short")
                else:
                    self.abandon_all(fresh, "its batch was cut short")
                raise
            refused = commit_claims(self, fresh, wakeups)
        self.deliver_now(wakeups)
        if refused is not None:
            raise StoreUnavailable(refused)
        return claims, conflict_at

    def _claim_here(self, job: Job[Any], lane: LaneState, fp: bytes | None, due: float | None) -> Claim | None:
        """The claim of a key this queue holds (step 1 of the module
        docstring; db_lock held), or None: the key's row decides."""
        key = job.key
        keys, ending = self.keys, self.records_.ending
        # A first look without the lock. A key leaves ``live`` for ``ending``
        # (under the lock), and only a claim (under db_lock, held here) makes
        # it live again: read in this order, a key found in neither is in neither.
        if not (keys.closing or key in keys.live or key in ending):
            return None
        with self.lock:
            if keys.closing or key in keys.live:
                return keys.claim(job, lane, fp, due, self.clock())
            held = ending.get(key)
            if held is None:
                return None
            entry = held.entry
            assert entry is not None
            return new_claim(Claim, (INFLIGHT, entry, conflict(entry.fp, fp, None)))

    def _claim_held(self, items: list[Item]) -> dict[str, tuple[Row, Taken | tuple[Row, bool]]]:
        """Where the store claims a batch in one statement (PostgreSQL), and not
        in the caller's transaction: claim the batch's keys held (``lock_all``)
        and not held by this queue, each once, ahead of the batch's loop
        (db_lock held; a key held here now is still held at its turn)."""
        if not self.store.claims_batches or self.in_user_tx or self.keys.closing:
            return {}
        rows: dict[str, Row] = {}
        with self.lock:
            here = [job.key in self.keys.live or job.key in self.records_.ending for job, _, _ in items]
        for (job, _, due), held in zip(items, here, strict=True):
            if job.key not in rows and not held:
                rows[job.key] = self._live_row(job, due)
        if not rows:
            return {}
        self._settle_here(list(rows))
        return dict(zip(rows, zip(rows.values(), self.conn.claim_held(list(rows.values())), strict=True), strict=True))

    def _live_row(self, job: Job[Any], due: float | None) -> Row:
        """A new claim's live row for ``job``."""
        wall = time.time()
        not_before = None if due is None else wall + max(0.0, due - time.monotonic())
        sfp = stable_fingerprint(job) if self.check_payload else None
        run = f"{self.holder}/{next(self._runs)}"
        return Row(job.key, "live", run, self.holder, sfp, None, None, None, 1, not_before, wall, None)

    def _claim(
        self, job: Job[Any], lane: LaneState, fp: bytes | None, due: float | None, read: bool,
        ahead: tuple[Row, Taken | tuple[Row, bool]] | None = None,
    ) -> tuple[Claim, list[Wakeup]]:  # fmt: skip
        """Claim a key this queue does not hold (db_lock held): its row decides.
        ``read``: read the row first (False: ``claim`` has, and found it not
        done). ``ahead``: the claim made already (``_claim_held``)."""
        key = job.key
        reuse = job.reuse or self.keys.reuse
        conn = self.conn
        wakeups: list[Wakeup] = []
        if read and self._read_first():  # a done key answers from a read, with no write lock taken
            row = conn.read(key)
            if row is not None and row.state == "done" and reuse != "always" and not row_expired(self.retention, row):
                return self._cached(row, job), wakeups
        self._begin()
        if ahead is not None:
            live, taken = ahead
            deferred = False
        else:
            live = self._live_row(job, due)
            # A key with no row, where the transaction holds every key: the claim
            # is written with the group (see _store_commit), not by a statement now.
            deferred = self.store.defers_claims and not self.in_user_tx and not conn.exists(key)
            taken = Taken.INSERTED if deferred else conn.claim(live, self.in_user_tx)
        if taken is Taken.BUSY:  # another transaction holds it: let ours go first, then wait
            wakeups += self.commit()
            self._begin()
            taken = conn.claim(live, True)
        if taken is Taken.INSERTED:
            found, row = Found.CLAIMED, None
        else:
            assert type(taken) is tuple
            alive = taken[1] and not holder_gone(taken[0].holder)
            found, row, ended = judge(
                taken[0], alive, reuse, self.holder, functools.partial(row_expired, self.retention)
            )
            if ended is not None:
                conn.settle([ended])
            if found is Found.CLAIMED:
                conn.put(live)
        if found is Found.CACHED:
            assert row is not None
            return self._cached(row, job), wakeups
        if found is Found.FAILED:
            assert row is not None
            failure = row.outcome().failure  # type: ignore[union-attr]
            return new_claim(Claim, (FAILED, failure, self._conflict(row, job))), wakeups
        if found is Found.REMOTE:
            assert row is not None
            remote = RemoteEntry(key, row.run, row.holder)
            return new_claim(Claim, (INFLIGHT, remote, self._conflict(row, job))), wakeups
        held = Held(live, row, lane.spec.trusted)
        with self.lock:
            self.records_.held[key] = held
            self.records_.found = as_record(row)
            try:
                claim = self.keys.claim(job, lane, fp, due, self.clock())
            finally:
                self.records_.found = None
            if claim.kind == "queued":
                held.entry = claim.value
                if due is not None:
                    self.scheduled.add(key)
                if deferred:  # (before the job can end, and its ended row follow)
                    self.commits.add_claim(Fresh(live))
                return claim, wakeups
            del self.records_.held[key]
        # (The queue began closing since step 1: the row goes back as it was,
        # unless the claim was to be written with the group: nothing was.)
        if not deferred:
            if row is None:
                conn.delete(key, live.run)
            else:
                conn.put(row)
        return claim, wakeups

    def _read_first(self) -> bool:
        """Read a key's row before claiming it? Where a read takes no lock
        (SQLite), so that a done key costs no write lock; but not while the
        group transaction is open: it holds the write lock already, and the
        claim's own statement reads the row."""
        return self.store.read_first and not self.conn.in_tx

    def _cached(self, row: Row, job: Job[Any]) -> Claim:
        return new_claim(Claim, (CACHED, row.outcome().output, self._conflict(row, job)))  # type: ignore[union-attr]

    def _conflict(self, row: Row, job: Job[Any]) -> tuple[str, Any] | None:
        if not self.check_payload or row.fp is None:
            return None
        return conflict(row.fp, stable_fingerprint(job), None)

    # --- abandoned claims: rows that must go ---------------------------------------------

    def _given_back(self, entries: list[Entry]) -> None:
        self.records_.abandoned(entries)

    def cancel_all(self, why: str) -> list[Any]:
        doomed = super().cancel_all(why)
        with self.lock:
            self.records_.abandoned([h.entry for h in self.records_.held.values()])
        self.deliver_now(self.commits.release_all())  # a cancelled queue waits for no store
        return doomed

    def rolled_back(self, entries: list[Entry], why: str) -> None:
        """Claims of a transaction that rolled back: their rows went with it,
        so nothing is written back; their handles end ``cancelled``."""
        with self.lock:
            self.records_.rolled_back(entries)
        super().abandon_all(entries, why)

    def decoded(self, entry: Entry, outcome: Completed[Any] | Failed) -> None:
        # (A decode thread's, no lock held: the output is readied for its row first.)
        if type(outcome) is Completed and self.decoding(entry):
            self.outputs.prepare(entry, outcome)
        super().decoded(entry, outcome)

    # --- waking a held key --------------------------------------------------------------

    def wake(self, entry: Any, target: float) -> Any:
        if type(entry) is not RemoteEntry:
            return super().wake(entry, target)
        # Another queue holds it: move its row's not_before; that queue's
        # watcher moves its timer (never a retry's backoff: see Core.wake).
        not_before = time.time() + max(0.0, target - time.monotonic())
        with self.db_lock:
            try:
                self._begin()
                self.conn.move_not_before(entry.key, entry.run, not_before)
                wakeups = self.commit()
            except StoreUnavailable:
                if not self.in_user_tx:
                    self._lost()
                raise
        self.deliver_now(wakeups)
        return None

    # --- waiting on another queue's key ------------------------------------------------

    def settled(self, entry: Any) -> bool:
        # An outcome is given out once its row is committed: until then its claim is held here.
        if entry.outcome is None:
            return False
        return type(entry) is RemoteEntry or self.commits.released or not self.records_.holds(entry)

    def wait_event(self, entry: Any) -> threading.Event | None:
        if type(entry) is RemoteEntry:
            self.watcher.watch(entry)
        event = super().wait_event(entry)  # (live: set by its end's wake-ups, after the commit: see deliver)
        if event is not None or self.settled(entry):
            return event
        event = threading.Event()  # ended, not yet durable: set after the commit
        return event if self.commits.hold([event.set]) and not self.settled(entry) else None

    def add_callback(self, entry: Any, callback: Callable[[], None]) -> bool:
        if type(entry) is RemoteEntry:
            self.watcher.watch(entry)
        if super().add_callback(entry, callback):
            return True
        return not self.settled(entry) and self.commits.hold([callback])

    # --- reading ----------------------------------------------------------------------

    def _read(self, read: Callable[[], Any], keys: list[str] | None) -> Any:
        """``read()`` under db_lock, after committing the outcomes it could miss."""
        with self.db_lock:
            wakeups = self._settle_keys(keys if keys is not None else list(self.commits.keys))
            found = read()
        self.deliver_now(wakeups)
        return found

    def state(self, key: str) -> State | None:
        return read_state(self, key)

    def snapshot(self, prefix: str | None, kinds: tuple[type, ...] | None) -> list[Any]:
        return read_snapshot(self, prefix, kinds)

    def forget(self, key: str) -> bool:
        return forget_key(self, key)

    def stats(self) -> Any:
        self.read_counts()
        return super().stats()

    def read_counts(self) -> None:
        """Read the store's counts of completed and failed keys (one query, under db_lock)."""
        self.records_.counts = self._read(self.conn.counts, None)

    # --- closing ------------------------------------------------------------------------

    def close_store(self) -> None:
        """The queue closed: commit what is left, give up the lease, let go of the database."""
        self.watcher.stop()
        self.outputs.close()
        self.committer.stop()
        with self.db_lock:
            wakeups = self.commit()
            if self.commits.pending:
                log.error("procq store %s: %d outcomes could not be written", self.store.url, len(self.commits.pending))
            wakeups += self.commits.release_all()
            try:
                self.conn.release(self.holder)
            except StoreUnavailable as exc:
                log.warning("procq store %s: the lease is left to expire: %s", self.store.url, exc)
            self.conn.close()
        self.deliver_now(wakeups)
