"""Reading a store queue's keys: ``q.state(key)``, ``q.keys()`` and
``q.handles()`` see this queue's live keys and every queue's rows; and
``q.forget(key)``, which reads a key's row before deleting it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from procq._core.entries import Ended
from procq._durable.records import row_expired
from procq._durable.remote import RemoteEntry
from procq._model.values import State
from procq._stores.base import Row, StoreUnavailable, holder_gone, interrupted

if TYPE_CHECKING:
    from procq._durable.core import StoreCore

__all__ = ["forget_key", "read_snapshot", "read_state"]


def _row_state(core: StoreCore, row: Row, dead: set[str]) -> State | RemoteEntry | None:
    """What a row says of its key: an outcome, a key live in another queue, or
    nothing (past its retention, or a claim of this queue on its way out)."""
    if row.state != "live":
        return None if row_expired(core.retention, row) else row.outcome()
    if row.holder == core.holder:
        return None
    if row.holder in dead or holder_gone(row.holder):
        return interrupted(row).outcome()
    return RemoteEntry(row.key, row.run, row.holder)


def read_state(core: StoreCore, key: str) -> State | None:
    with core.lock:
        entry = core.keys.live.get(key)
        if entry is not None:
            return entry.state()
        ending = core.records_.ending.get(key)
        if ending is not None and ending.entry is not None:  # ended, its row not committed: a push joins it
            return ending.entry.state_before_outcome()
    row = core._read(lambda: core.conn.read(key), [key])
    if row is None:
        return None
    dead = core._read(core.conn.dead_holders, []) if row.state == "live" else set()
    found = _row_state(core, row, dead)
    return found.state() if type(found) is RemoteEntry else found  # type: ignore[return-value]


def read_snapshot(core: StoreCore, prefix: str | None, kinds: tuple[type, ...] | None) -> list[Any]:
    rows = core._read(lambda: core.conn.scan(prefix), None)
    dead = core._read(core.conn.dead_holders, []) if any(r.state == "live" for r in rows) else set()
    with core.lock:
        live = dict(core.keys.live)
    found: list[Any] = [e for k, e in live.items() if prefix is None or k.startswith(prefix)]
    for row in rows:
        if row.key in live:
            continue
        got = _row_state(core, row, dead)
        if got is not None:
            found.append(got if type(got) is RemoteEntry else Ended(row.key, got))  # type: ignore[arg-type]
    if kinds is not None:
        found = [e for e in found if type(e.state()) in kinds]
    found.sort(key=lambda e: e.key)
    return found


def forget_key(core: StoreCore, key: str) -> bool:
    """``q.forget(key)``: delete an ended key's row (its uncommitted outcome committed first)."""
    with core.db_lock:
        with core.lock:
            if key in core.keys.live:
                return core.keys.forget(key, core.clock())  # raises: a live key
        wakeups = core._settle_keys([key])
        row = core.conn.read(key, whole=False)  # (its state and run: not its output)
        if row is None:
            forgotten = False
        else:
            if row.state == "live" and row.holder != core.holder and row.holder not in core.conn.dead_holders():
                raise ValueError(
                    f"cannot forget key {key!r}: it is live in another queue; only a key that ended "
                    "(completed or failed) can be forgotten"
                )
            try:
                core._begin()
                forgotten = core.conn.delete(key, row.run)
                wakeups += core.commit()
            except StoreUnavailable:
                if not core.in_user_tx:
                    core._lost()
                raise
    core.deliver_now(wakeups)
    return forgotten
