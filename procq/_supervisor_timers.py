"""When the supervisor's I/O thread must act on its own, not woken by a worker.

``Timers`` keeps the times of the supervisor's own actions (the core keeps
those of jobs: deadlines and due times) and gives the selector its timeout.
Only the I/O thread touches it; times are the core's clock (``Core.clock``).
"""

from __future__ import annotations

from typing import Any

from procq._entries import WorkerSlot

__all__ = ["MEMORY_CHECK_INTERVAL", "Timers"]

#: How often the memory of running jobs with a memory limit is sampled.
MEMORY_CHECK_INTERVAL = 0.05


class Timers:
    """Starts to try again, workers to kill after a grace, SIGKILLs due after
    a SIGTERM, and the next memory sample."""

    __slots__ = ("_kills", "_retry_at", "kill_at", "next_sample")

    def __init__(self) -> None:
        self._retry_at: dict[str, list[float]] = {}  # lane name -> times to try starting a worker again
        # Workers at EOF or retired: killed if still alive then.
        self.kill_at: dict[WorkerSlot, float] = {}
        # SIGKILLs due after a SIGTERM's grace: (when, worker, its descendants then), soonest first.
        self._kills: list[tuple[float, WorkerSlot, list[Any]]] = []
        self.next_sample = 0.0  # next memory sample, while memory-limited jobs run

    def timeout(self, deadline: float | None, sampling: bool, now: float) -> float | None:
        """How long the selector may sleep: until the soonest of these times,
        the core's next ``deadline`` and (``sampling``) the next memory sample."""
        times = [t for ts in self._retry_at.values() for t in ts]
        times.extend(self.kill_at.values())
        if self._kills:
            times.append(self._kills[0][0])
        if sampling:
            times.append(self.next_sample)
        if deadline is not None:
            times.append(deadline)
        when = min(times, default=None)
        if when is None:
            return None
        return max(0.0, when - now)

    def sample_due(self, now: float) -> bool:
        return now >= self.next_sample

    def retry_start(self, lane: str, when: float) -> None:
        self._retry_at.setdefault(lane, []).append(when)

    def starts_due(self, now: float) -> list[str]:
        """The lanes to start a worker for now (a lane once per start due)."""
        names: list[str] = []
        for name, times in self._retry_at.items():
            due = [t for t in times if t <= now]
            if due:
                self._retry_at[name] = [t for t in times if t > now]
                names += [name] * len(due)
        return names

    def overdue(self, now: float) -> list[WorkerSlot]:
        """Workers whose grace (``kill_at``) is over, taken off the list."""
        if not self.kill_at:
            return []
        due = [worker for worker, when in self.kill_at.items() if when <= now]
        for worker in due:
            del self.kill_at[worker]
        return due

    def kill_later(self, when: float, worker: WorkerSlot, descendants: list[Any]) -> None:
        self._kills.append((when, worker, descendants))
        self._kills.sort(key=lambda k: k[0])

    def kills_due(self, now: float) -> list[tuple[WorkerSlot, list[Any]]]:
        """The SIGKILLs due now: (worker, its descendants at the SIGTERM)."""
        if not self._kills or self._kills[0][0] > now:
            return []
        due = [(worker, descendants) for when, worker, descendants in self._kills if when <= now]
        self._kills = [k for k in self._kills if k[0] > now]
        return due

    def take_kills(self) -> list[tuple[float, WorkerSlot, list[Any]]]:
        """Every SIGKILL still waiting, taken off the list (the queue stops)."""
        kills, self._kills = self._kills, []
        return kills
