"""The core's two time orders: running jobs' deadlines, and waiting jobs' due times.

Both are heaps of ``(time, job_id, entry)`` that the supervisor's I/O thread
sleeps towards (``Core.next_deadline``); no thread polls. Items are never
removed from the middle of a heap: an item whose entry moved on (another
attempt, a new due time, an end) is stale, and is discarded when it reaches
the top. Times are on ``Core.clock``; everything here runs under ``Core.lock``.
"""

from __future__ import annotations

import heapq

from procq._core.entries import PROCESSING, Entry, current_timer

__all__ = ["Timers"]


class Timers:
    __slots__ = ("deadlines", "waiting")

    def __init__(self) -> None:
        # Running jobs with a time limit: (deadline, job_id, entry). An item is
        # current while its entry is PROCESSING with that very deadline.
        self.deadlines: list[tuple[float, int, Entry]] = []
        # Entries waiting for their time (``Job.not_before``, a retry backoff):
        # (due, job_id, entry). An item is current while ``current_timer`` says so.
        self.waiting: list[tuple[float, int, Entry]] = []

    def wait(self, entry: Entry, due: float) -> None:
        """``entry`` waits until ``due`` before it enters its lane."""
        entry.due = due
        entry.timed = True
        heapq.heappush(self.waiting, (due, entry.job_id, entry))

    def limit(self, entry: Entry, deadline: float) -> None:
        """``entry``, which has just started, must end by ``deadline``."""
        entry.deadline = deadline
        heapq.heappush(self.deadlines, (deadline, entry.job_id, entry))

    def next(self) -> float | None:
        """The nearest current deadline or due time."""
        heap = self.deadlines
        while heap and (heap[0][2].status is not PROCESSING or heap[0][2].deadline != heap[0][0]):
            heapq.heappop(heap)
        waiting = self.waiting
        while waiting and not current_timer(waiting[0]):
            heapq.heappop(waiting)
        times = [h[0][0] for h in (heap, waiting) if h]
        return min(times) if times else None

    def due(self, now: float) -> list[Entry]:
        """The waiting entries whose time has come, no longer timed."""
        found: list[Entry] = []
        waiting = self.waiting
        while waiting and waiting[0][0] <= now:
            item = heapq.heappop(waiting)
            if current_timer(item):
                entry = item[2]
                entry.timed = False
                entry.due = None
                found.append(entry)
        return found

    def expired(self, now: float) -> list[Entry]:
        """The running entries past their deadline (their items are popped)."""
        found: list[Entry] = []
        heap = self.deadlines
        while heap and heap[0][0] <= now:
            deadline, _, entry = heapq.heappop(heap)
            if entry.status is PROCESSING and entry.deadline == deadline:
                found.append(entry)
        return found

    def take_waiting(self) -> list[Entry]:
        """Every entry waiting for its time (the heap is emptied)."""
        found = [item[2] for item in self.waiting if current_timer(item)]
        self.waiting.clear()
        return found

    def check(self, live: dict[str, Entry]) -> None:
        """Every current waiting item is a live entry's (for ``Core._check_invariants``)."""
        for item in self.waiting:
            if current_timer(item):
                assert live.get(item[2].key) is item[2], item
