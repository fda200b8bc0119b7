"""What the supervisor's I/O thread waits on, and for how long; its memory
samples (``check_memory``); and its last wait, for every worker to exit when
the queue stops (``stop_workers``).

``Watcher`` is its one epoll selector: every worker channel's pipe and death
sentinel, and the wake-up pipe other threads write to (close, cancel, a new
deadline), registered once and kept for as long as the thread lives (not
rebuilt on every wait). ``Timers`` keeps the times of the supervisor's own
actions (the core keeps those of jobs: deadlines and due times) and gives the
selector its timeout, in the core's clock (``Core.clock``). Only the I/O thread
touches them, but for ``Watcher.wake``.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from procq._core.entries import WorkerLife, WorkerSlot
from procq._supervisor import log as _log
from procq._supervisor.failures import memory_failure, stopped_failure
from procq._system.processes import children_map, wait_for_exits

if TYPE_CHECKING:
    from procq._core.core import Core

__all__ = [
    "CANCEL_GRACE",
    "MAX_SLEEP",
    "MEMORY_CHECK_INTERVAL",
    "STOP_GRACE",
    "Timers",
    "Watcher",
    "check_memory",
    "stop_workers",
]

#: How long stopping workers get to exit on their own before they are killed.
STOP_GRACE = 3.0
#: The same when the queue closes without waiting (an idle worker exits on EOF in milliseconds).
CANCEL_GRACE = 0.2
#: How often the memory of running jobs with a memory limit is sampled.
MEMORY_CHECK_INTERVAL = 0.05
#: The longest the selector sleeps at once. epoll takes its timeout in
#: milliseconds in a C int (about 24.8 days), and a due time may be as far off
#: as a ``datetime`` can say: the thread wakes at least this often and simply
#: sleeps again towards whatever is still ahead.
MAX_SLEEP = 86400.0


class Watcher:
    """The selector of the I/O thread, and its wake-up pipe."""

    def __init__(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._wake_lock = threading.Lock()
        self._wake_closed = False
        self._by_object: dict[Any, WorkerSlot] = {}  # each watched pipe and sentinel -> its worker
        # Pipes a caller reads itself for now (``pause``): watched, not in the selector.
        self._paused: set[Any] = set()
        self._lock = threading.Lock()  # registrations: ``pause`` and ``resume`` come from other threads
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._wake_r)

    def wake(self) -> None:
        """Wake the I/O thread (from any thread)."""
        # Under a lock so that the pipe is never closed (and its descriptor
        # reused by someone else's file) between the check and the write.
        with self._wake_lock:
            if self._wake_closed:
                return
            with contextlib.suppress(BlockingIOError):  # the pipe is full: a wake-up is pending anyway
                os.write(self._wake_w, b"\0")

    @property
    def wake_fd(self) -> int:
        """The wake-up pipe's read end (non-blocking), for a wait of the I/O thread's own."""
        return self._wake_r

    def watch(self, worker: WorkerSlot) -> None:
        """Wait on the worker channel's messages and death."""
        channel = worker.channel
        with self._lock:
            for obj in (channel.messages, channel.sentinel):
                self._by_object[obj] = worker
                self._selector.register(obj, selectors.EVENT_READ, obj)

    def watched(self, worker: WorkerSlot) -> bool:
        """Is the worker's pipe still read (not at EOF, not broken, not retired)?"""
        return worker.channel.messages in self._by_object

    def unwatch(self, obj: Any) -> None:
        """Stop waiting on ``obj`` (before it is closed: a closed descriptor
        cannot be taken out of an epoll set)."""
        with self._lock:
            if self._by_object.pop(obj, None) is not None and obj not in self._paused:
                self._selector.unregister(obj)
            self._paused.discard(obj)

    def pause(self, worker: WorkerSlot) -> bool:
        """Stop waiting on the worker's messages while another thread reads
        them (from any thread). False if they are not watched (any more)."""
        obj = worker.channel.messages
        with self._lock:
            if obj not in self._by_object or obj in self._paused:
                return False
            self._selector.unregister(obj)
            self._paused.add(obj)
            return True

    def resume(self, worker: WorkerSlot) -> None:
        """Wait on the worker's messages again, after ``pause`` (from any thread)."""
        obj = worker.channel.messages
        with self._lock:
            if obj in self._paused:
                self._paused.discard(obj)
                if obj in self._by_object:
                    self._selector.register(obj, selectors.EVENT_READ, obj)

    def workers(self) -> set[WorkerSlot]:
        return set(self._by_object.values())

    def select(self, timeout: float | None) -> Iterator[tuple[WorkerSlot, bool]]:
        """Wait up to ``timeout`` (None: for ever), then yield each worker
        with news: True for its messages, False for its death."""
        for key, _ in self._selector.select(timeout):
            obj = key.data
            if obj is self._wake_r:
                self._drain_wakeups()
                continue
            # Looked up now, not before: acting on an earlier one may have unwatched it.
            worker = self._by_object.get(obj)
            if worker is None or worker.life is WorkerLife.DEAD:
                continue
            yield worker, obj is worker.channel.messages

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        with self._lock:
            self._by_object.clear()
            self._paused.clear()
            self._selector.close()
        with self._wake_lock:
            self._wake_closed = True
            os.close(self._wake_r)
            os.close(self._wake_w)


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
        the core's next ``deadline`` and (``sampling``) the next memory sample,
        and never longer than ``MAX_SLEEP``."""
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
        return min(max(0.0, when - now), MAX_SLEEP)

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
        """Every SIGKILL still waiting, taken off the list (the queue stops, or closes without waiting)."""
        kills, self._kills = self._kills, []
        return kills


def check_memory(core: Core) -> None:
    """Kill running jobs whose process tree went over their memory limit
    (on the I/O thread, every ``MEMORY_CHECK_INTERVAL`` while any has one)."""
    watched = core.memory_limited()
    if not watched:
        return
    children = children_map()
    for worker, entry in watched:
        limit = entry.memory_limit
        assert limit is not None
        used = worker.channel.job_memory(entry, children)
        if used <= limit:
            continue
        if core.decide_kill(worker, entry, memory_failure(worker, entry, limit, used)):
            _log.memory_kill(worker, entry, limit, used)
            worker.channel.kill()


def stop_workers(
    core: Core, watcher: Watcher, timers: Timers, hurried: Callable[[], bool], forget: Callable[[int | None], None]
) -> None:
    """Stop every worker the I/O thread watches: EOF first, SIGKILL after
    ``STOP_GRACE`` (``CANCEL_GRACE`` once ``hurried()``: the queue closes
    without waiting), at once for a stopped one; reap them all, telling
    ``forget`` (the undertaker) before each reap. (No job is sent any more.)"""
    for _, worker, descendants in timers.take_kills():  # a grace cut short: nothing outlives the queue
        worker.channel.kill(descendants)
    workers = [w for w in watcher.workers() if w.life is not WorkerLife.DEAD]
    with core.lock:
        for w in workers:
            w.doom()
        closable = [w for w in workers if w.sending == 0]
    for w in closable:
        # Out of the selector first: a closed pipe cannot be taken out, and a
        # waiter that stopped reading it just now may have handed it back to
        # be closed (unwatched) once more.
        watcher.unwatch(w.channel.messages)
        w.channel.close()
    channels = [w.channel for w in workers]
    for channel in wait_for_exits(channels, STOP_GRACE, watcher.wake_fd, hurried, CANCEL_GRACE):
        channel.kill()
    for w in workers:
        w.channel.kill_group()  # jobs' leftovers
        forget(w.channel.pid)
        w.channel.reap()
        # A worker still holding a job here means the loop itself failed:
        # the job must still end, so no handle hangs.
        core.deliver(core.worker_died(w, stopped_failure)[1])
        w.channel.release()
    core.handoffs()  # (nothing is sent any more)
