"""Jobs that ended on their worker and whose outcome a decode thread is still
decoding (see ``_supervisor.decode``): the core's part that holds them.

Such a job has left its worker (which takes its next jobs) but stays
PROCESSING, with no worker and no deadline, counted in its lane's
``running``, until its outcome arrives (``give``) or it is ended from outside
(``cancel``, ``end_all``). Everything here runs under ``Core.lock``.
"""

from __future__ import annotations

from typing import Any

from procq._core.entries import PROCESSING, Entry, LaneState, Wakeup
from procq._core.statemap import StateMap
from procq._model.values import Completed, Failed, Failure

__all__ = ["Decoding"]


class Decoding:
    __slots__ = ("entries", "keys")

    def __init__(self, keys: StateMap) -> None:
        self.keys = keys
        self.entries: set[Entry] = set()

    def hold(self, entry: Entry) -> None:
        """``entry``'s worker reported it ended; its outcome is being decoded."""
        entry.worker = None
        entry.deadline = None  # it has stopped running: its time limit is over
        self.entries.add(entry)

    def give(self, entry: Entry, outcome: Completed[Any] | Failed, now: float, wakeups: list[Wakeup]) -> bool:
        """The decoded outcome: the job ends (or, failed with a Retry left,
        goes back to its timer). False, and nothing done, if it ended meanwhile."""
        if entry not in self.entries:
            return False
        self.entries.discard(entry)
        wakeups += self.keys.finish(entry, outcome, now)
        return True

    def cancel(self, entry: Entry, now: float, wakeups: list[Wakeup]) -> bool:
        """``q.cancel`` of ``entry``, if it is held here: it ends cancelled."""
        if entry not in self.entries:
            return False
        self.entries.discard(entry)
        failure = Failure("cancelled", f"job {entry.key!r} was cancelled by q.cancel() while its outcome was decoded")
        wakeups += self.keys.settle(entry, Failed(failure), now)
        return True

    def end_all(self, why: str, now: float, wakeups: list[Wakeup]) -> None:
        """Closing without waiting: every job held here ends cancelled (a
        decode still running is dropped when it ends)."""
        for entry in self.entries:
            wakeups += self.keys.settle(entry, Failed(Failure("cancelled", f"job {entry.key!r} {why}")), now)
        self.entries.clear()

    def check(self, lane: LaneState, live: dict[str, Entry]) -> int:
        """Assert the invariants of ``lane``'s jobs held here; returns how many there are."""
        held = [e for e in self.entries if e.lane is lane]
        for e in held:
            assert e.status is PROCESSING and e.worker is None and live.get(e.key) is e
        return len(held)
