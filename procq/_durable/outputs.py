"""A job's output made ready for its row before the core hears of its end.

A queue on a store writes each ended row from its committer, in order, and
wakes a job's waiters once the row is committed (``_durable.commit``). A
large output used to cost every other job of the queue twice: encoding it
(pickling 30 MB took up to 120 ms) ran under ``Core.lock``, where no other
job could end; and its row's write held SQLite's one write lock for 150-450
ms, while every push and every later outcome waited for the connection.

So a trusted job whose outcome a decode thread decoded (``_supervisor.decode``:
every large result comes that way) has its output readied there, with no
lock held, before ``Core.decoded`` ends it: it stays Processing meanwhile, as
any job whose outcome is being decoded. ``prepare`` encodes the output for
the row, and, where the store writes large outputs in pieces
(``Store.spill_over``: SQLite), writes it in pieces on a connection of its
own, each piece a short transaction of its own, while the queue's other jobs
are claimed, answered and committed between them. The row then holds what
the store put in the output's place, and its commit is as short as any.

It is best effort: what it cannot do (the claim is gone, the store refuses,
the output cannot be pickled) is left to ``StoreRecords.record``, which
encodes under the lock as before and says why an output cannot be stored.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from procq._core.entries import Entry
from procq._model.values import Completed
from procq._stores.base import Conn, StoreError, encode_outcome

if TYPE_CHECKING:
    from procq._durable.core import StoreCore

__all__ = ["Outputs"]

log = logging.getLogger("procq.store")


class Outputs:
    """Outputs readied for their rows off the lock (see the module docstring)."""

    def __init__(self, core: StoreCore) -> None:
        self._core = core
        self._lock = threading.Lock()  # the spill connection's: one output at a time
        self._conn: Conn | None = None  # opened at the first spill
        self._closed = False

    def prepare(self, entry: Entry, outcome: Completed[Any]) -> None:
        """Encode ``entry``'s output for its row (and spill it, if large), for
        ``StoreRecords.record`` to take (``Held.encoded``). On a decode thread,
        whose job must end whatever happens here: nothing is raised."""
        try:
            self._prepare(entry, outcome)
        except Exception:  # (record() encodes it under the lock, as without this)
            log.exception("procq store %s: the output of %r could not be readied", self._core.store.url, entry.key)

    def _prepare(self, entry: Entry, outcome: Completed[Any]) -> None:
        core = self._core
        held = core.records_.held.get(entry.key)
        if held is None or held.entry is not entry:
            return
        try:
            state, output, encoding, failure = encode_outcome(outcome, held.trusted)
        except Exception:
            return  # (record() encodes it again, and tells why it cannot be stored)
        over = core.store.spill_over
        if over is not None and output is not None and encoding is not None and len(output) > over:
            spilled = self._spill(entry.key, held.live.run, output, encoding)
            if spilled is not None:
                output, encoding = spilled
        held.encoded = (outcome, (state, output, encoding, failure))

    def _spill(self, key: str, run: str, output: bytes, encoding: str) -> tuple[bytes, str] | None:
        with self._lock:
            if self._closed:
                return None
            try:
                if self._conn is None:
                    self._conn = self._core.store.connect()
                return self._conn.spill(key, run, output, encoding)
            except StoreError as exc:  # (the row is written whole instead)
                log.warning("procq store %s: the output of %r is written whole: %s", self._core.store.url, key, exc)
                return None

    def close(self) -> None:
        """The queue closed: no more spills; the connection goes."""
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None
