"""Keys held by other queues of a store, and the thread that keeps this
queue's lease and watches them.

A push of a key that another live queue holds answers ``InFlight`` with a
handle on a ``RemoteEntry``: it has what ``JobHandle`` and ``Core.wait_event``
/ ``add_callback`` read of an ``Entry`` (``key``, ``outcome``, ``event``,
``callbacks``, ``state()``), and its outcome is set by the ``Watcher``, under
``Core.lock``, when the key's row says its run ended. A handle nobody waits on
costs nothing: an entry is watched from its first wait.

The ``Watcher`` is one thread per queue with its own connection. It renews
the queue's lease every third of it, deletes rows past the queue's retention
(``_durable.records.sweep_rows``), and, while entries are watched, reads their rows
every ``Store.poll`` seconds (SQLite) or when PostgreSQL notifies that a row
ended. While this queue holds keys waiting for their ``not_before``, it reads
their rows' times too (SQLite: every poll; PostgreSQL: when notified of a
wake), so another queue's ``push(wake=True)`` moves their timers. A watched row whose
holder's lease expired is rewritten as interrupted (guarded by its run) and
its joiners are woken with that failure. If the key was claimed again before
a poll saw the end (its run changed), the entry follows the new run: what its
caller wants is the key's outcome.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from procq._core.entries import DONE, PENDING, run_wakeups
from procq._durable.records import sweep_rows
from procq._model.values import Completed, Failed, Failure, Processing, State
from procq._stores.base import Row, StoreUnavailable, holder_gone, interrupted

if TYPE_CHECKING:
    from procq._durable.core import StoreCore

__all__ = ["RemoteEntry", "Watcher"]

log = logging.getLogger("procq.store")

_PROCESSING = Processing()


class RemoteEntry:
    """A key live in another queue of the store, as a handle sees it."""

    __slots__ = ("callbacks", "event", "holder", "key", "outcome", "run")

    def __init__(self, key: str, run: str, holder: str | None) -> None:
        self.key = key
        self.run = run
        self.holder = holder
        self.outcome: Completed[Any] | Failed | None = None
        self.event: threading.Event | None = None
        self.callbacks: list[Callable[[], None]] | None = None

    @property
    def status(self) -> Any:
        return PENDING if self.outcome is None else DONE

    def state(self) -> State:
        # The holder's queue alone knows whether it started: "in flight" reads as Processing.
        outcome = self.outcome
        return _PROCESSING if outcome is None else outcome


class Watcher(threading.Thread):
    """Keeps the lease, retries refused writes, resolves watched remote entries."""

    def __init__(self, core: StoreCore) -> None:
        super().__init__(name=f"procq-store-{core.holder}", daemon=True)
        self.core = core
        self.store = core.store
        self.conn = core.store.connect()
        self._notified = getattr(self.conn, "notifies", False)
        # Where its wait for a notification is ended when the queue closes
        # (not at the lease's next third): a channel of its own, named from its holder.
        self._own = "procq_stop_" + hashlib.blake2b(core.holder.encode(), digest_size=8).hexdigest()
        if self._notified:
            self.conn.listen(self._own)  # type: ignore[attr-defined]
        self._watched: dict[str, list[RemoteEntry]] = {}  # under _lock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._failing = False  # the store failed the last round

    def watch(self, entry: RemoteEntry) -> None:
        """Watch ``entry`` from now on (a waiter's thread), then read its row
        once, on the queue's connection: an end this thread could have missed
        (before it watched) is seen there."""
        if entry.outcome is not None:
            return
        with self._lock:
            entries = self._watched.setdefault(entry.key, [])
            if entry not in entries:
                entries.append(entry)
        self._wake.set()
        core = self.core
        with core.db_lock:
            row = core.conn.read(entry.key)
        if row is not None and row.state != "live":
            self._resolve_one(entry, row.outcome())

    def _resolve_one(self, entry: RemoteEntry, outcome: Completed[Any] | Failed) -> None:
        """``entry``'s run ended (its waiter read the row itself)."""
        with self._lock:
            entries = self._watched.get(entry.key)
            if entries is not None and entry in entries:
                entries.remove(entry)
                if not entries:
                    del self._watched[entry.key]
        self._resolve([(entry, outcome)])

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._notified and self.is_alive():
            try:
                with self.core.db_lock:
                    self.core.conn.nudge(self._own)  # type: ignore[attr-defined]
            except StoreUnavailable:
                pass  # (the store refuses: its wait ends at its timeout, a third of the lease at most)
        self.join()
        with self._lock:
            left = [e for entries in self._watched.values() for e in entries]
            self._watched.clear()
        closed = Failed(Failure("cancelled", "the queue was closed while this handle waited for another queue's job"))
        self._resolve([(e, closed) for e in left])
        self.conn.close()

    def run(self) -> None:
        lease = self.store.lease
        renew_at = time.monotonic() + lease / 3
        core = self.core
        while not self._stopping:
            with self._lock:
                watching = bool(self._watched)
            scheduled = bool(core.scheduled)
            now = time.monotonic()
            wait = max(0.0, renew_at - now)
            if watching or scheduled:
                wait = min(wait, self.store.poll)
            told: set[str] = set()
            try:
                if self._notified:
                    told = self.conn.wait(wait)
                else:
                    self._wake.wait(wait)
                self._wake.clear()
                if self._stopping:
                    return
                with self._lock:  # (a key watched while this thread waited counts)
                    watching = bool(self._watched)
                if time.monotonic() >= renew_at:
                    self.conn.renew(core.holder, lease)
                    renew_at = time.monotonic() + lease / 3
                    sweep_rows(core, self.conn)
                    if core.store.spill_over is not None:
                        self.conn.drop_orphans()
                if watching:
                    self._poll()
                if scheduled and (not self._notified or not told or "procq_wake" in told):
                    self._wakes()
                self._failing = False
            except StoreUnavailable as exc:
                if not self._failing:  # once an outage, not once a poll
                    log.warning("procq store %s: %s (retrying)", self.store.url, exc)
                self._failing = True
                renew_at = min(renew_at, time.monotonic() + min(1.0, lease / 3))
                self._wake.wait(min(1.0, self.store.poll * 10))

    def _wakes(self) -> None:
        """Timers another queue moved earlier (its ``wake``), on this queue's
        scheduled rows: a timer due later than its row's not_before moves to it."""
        core = self.core
        rows = self.conn.scheduled(core.holder)
        with core.lock:
            core.scheduled.intersection_update(k for k in rows if k in core.keys.live)
        offset = time.monotonic() - time.time()
        for key, not_before in rows.items():
            with core.lock:
                entry = core.keys.live.get(key)
            if entry is None or entry.due is None:
                continue
            target = not_before + offset
            if target < entry.due - 0.001:  # (the two clocks' conversion is not exact)
                worker = core.wake(entry, target)
                if worker is not None:
                    worker.channel.send_job(core, worker, entry)

    def _poll(self) -> None:
        with self._lock:
            keys = list(self._watched)
        rows = self.conn.rows(keys)
        dead: set[str] | None = None
        ended: list[tuple[RemoteEntry, Completed[Any] | Failed]] = []
        for key in keys:
            row = rows.get(key)
            outcome: Completed[Any] | Failed | None = None
            if row is None:
                outcome = Failed(Failure("cancelled", f"job {key!r}: its record was removed before it ended"))
            elif row.state == "live":
                if dead is None:
                    dead = self.conn.dead_holders()
                if row.holder in dead or holder_gone(row.holder):
                    outcome = self._interrupt(row)
                else:
                    self._follow(key, row)
            else:
                outcome = row.outcome()
            if outcome is not None:
                with self._lock:
                    for entry in self._watched.pop(key, ()):
                        ended.append((entry, outcome))
        self._resolve(ended)

    def _follow(self, key: str, row: Row) -> None:
        with self._lock:
            for entry in self._watched.get(key, ()):
                entry.run, entry.holder = row.run, row.holder

    def _interrupt(self, row: Row) -> Failed:
        """End a live row whose holder's lease expired as interrupted (its own
        run only), and return how the key ended."""
        failed = interrupted(row)
        conn = self.conn
        conn.begin()
        try:
            conn.settle([failed])
            now = conn.read(row.key)
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        if now is not None and now.state != "live":
            return now.outcome()  # type: ignore[return-value]
        return failed.outcome()  # type: ignore[return-value]

    def _resolve(self, ended: list[tuple[RemoteEntry, Completed[Any] | Failed]]) -> None:
        if not ended:
            return
        wakeups: list[Callable[[], None]] = []
        with self.core.lock:
            for entry, outcome in ended:
                if entry.outcome is not None:
                    continue
                entry.outcome = outcome
                if entry.event is not None:
                    wakeups.append(entry.event.set)
                if entry.callbacks:
                    wakeups.extend(entry.callbacks)
                    entry.callbacks = None
        run_wakeups(wakeups)
