"""Pushes inside the caller's own transaction: ``ProcQueue.transaction()``.

``with q.transaction() as tx:`` opens a transaction on the queue's store
connection and hands it to the caller: ``tx.execute(sql, params)`` runs the
caller's statements in it (``tx.connection`` is the DB-API connection
itself), and ``tx.push`` / ``tx.push_all`` claim keys in it. Its pushes are
answered at once, as ``q.push`` would answer them, but a fresh job does not
start until the transaction commits at the end of the block; then it enters
its lane (waiting for room like ``q.push_all``). If the block raises, or the
commit fails, the transaction rolls back: the rows it wrote are gone, as if it
never ran, and the handles of its fresh jobs end ``cancelled``.

While it is open the transaction has the queue's connection to itself: other
threads' pushes on this queue, and the writing of its jobs' outcomes, wait
for it to end. Keep it short. (On SQLite it also holds the file's write lock,
as any write transaction does.)
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from procq._api.outcomes import PushOutcome
from procq._api.push import Batch, ThreadRoom
from procq._model.errors import ProcQueueError
from procq._model.job import Job
from procq._stores.base import StoreUnavailable

if TYPE_CHECKING:
    from procq._api.queue import ProcQueue
    from procq._durable.core import StoreCore

__all__ = ["StoreTransaction"]


class StoreTransaction:
    """A transaction on a queue's store, with pushes that start at its commit
    (see the module docstring). Made by ``ProcQueue.transaction()``; used once,
    as a context manager, by the thread that made it."""

    def __init__(self, queue: ProcQueue, core: StoreCore) -> None:
        self._queue = queue
        self._core = core
        self._batches: list[Batch] = []
        self._thread: int | None = None
        self._ended = False

    def __enter__(self) -> StoreTransaction:
        if self._thread is not None or self._ended:
            raise ProcQueueError("a transaction is used once, in one with block")
        core = self._core
        core.db_lock.acquire()
        try:
            if core.in_user_tx:
                raise ProcQueueError(
                    "a transaction is already open on this queue in this thread: transactions do not nest"
                )
            wakeups = core.commit()  # the group transaction's claims and the queued outcomes go first
            if core.conn.in_tx:  # the store refused that commit
                raise StoreUnavailable(f"the store {core.store.url} cannot be written now")
            core.conn.begin()
            core.in_user_tx = True
        except BaseException:
            core.db_lock.release()
            raise
        self._thread = threading.get_ident()
        core.deliver_now(wakeups)
        return self

    @property
    def connection(self) -> Any:
        """The DB-API connection the transaction runs on (``sqlite3`` or ``psycopg``)."""
        self._check()
        return self._core.conn.raw()

    def execute(self, sql: str, params: Any = ()) -> Any:
        """Run one of the caller's statements in the transaction; returns the cursor."""
        self._check()
        return self._core.conn.raw().execute(sql, params)

    def push(self, job: Job[Any], *, wake: bool = False) -> PushOutcome[Any]:
        """Push ``job`` in the transaction: answered now, started at commit."""
        return self.push_all([job], wake=wake)[0]

    def push_all(self, jobs: Iterable[Job[Any]], *, wake: bool = False) -> list[PushOutcome[Any]]:
        """Push many jobs in the transaction, as ``ProcQueue.push_all`` does."""
        self._check()
        batch = self._queue._pusher.claim_all(jobs, wake, self._queue)
        self._batches.append(batch)
        return batch.outcomes

    def _check(self) -> None:
        if self._ended or self._thread is None:
            raise ProcQueueError("this transaction is not open: use it inside its with block")
        if self._thread != threading.get_ident():
            raise ProcQueueError("a transaction is used by the thread that opened it")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        core = self._core
        self._ended = True
        committed = False
        try:
            if exc_type is None:
                try:
                    core.conn.commit()
                    committed = True
                except StoreUnavailable:
                    core.conn.rollback()
                    raise
            else:
                core.conn.rollback()
        finally:
            core.in_user_tx = False
            core.group_since = None
            core.db_lock.release()
            if not committed:
                fresh = [e for b in self._batches for e in b._fresh]
                why = "the transaction that pushed it " + (
                    "failed to commit" if exc_type is None else "was rolled back"
                )
                core.rolled_back(fresh, why)
        core.committer.poke()  # outcomes that waited for the transaction
        if not committed:
            return
        for batch in self._batches:
            with batch:
                for room in batch.offers(ThreadRoom):
                    room.wait()
