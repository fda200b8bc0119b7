"""Starting workers: the I/O thread's side (``Starts``), and one starter
thread per queue that starts processes off the I/O thread (``Starter``).

Why: ``Process.start()`` under forkserver is a round trip to the server
(milliseconds), a fresh ``python -I`` for an untrusted lane a fork and exec.
Run on the I/O thread, each start would stall every death, read and send of
the queue for that long, and a lane whose jobs crash often would spend its
time starting processes one after another. So the I/O thread only asks
(``request``, no wait), and the starter thread starts and hands each process
back (``done``, then ``wake``).

What stays with the I/O thread: it alone watches, registers and reaps
workers. It takes what the starter handed back (``take``) and registers it
(the undertaker learns the pid, the selector watches its pipe and death, the
core files it: ``Starts._register``) before it can read the worker's
READY, so before the worker can run a job; a start that failed comes back as
its exception. A process started for a lane takes the place of whatever the
lane needs first (``_core.spares.arrive``): a replacement, else a spare.

Stopping: ``stop`` drops the starts not begun, waits for the one under way
and hands back what it made, which the I/O thread registers like any other
worker, so ``stop_workers`` stops and reaps it: no process started here
outlives the queue unwatched.

Only the kinds of worker that are local processes start here
(``WorkerChannel.starts_off_thread``); a Dask lane's slots start on the I/O
thread, which owns the lane's client. What starts here is never one of the
queue's first workers (``mark_starter_thread``): a trusted lane's are forked
by the lane's template (``_worker.template``), which the first start here makes.

The starter thread also runs warm-ups (``Starter.warm``, asked from any
thread through ``Launch.warmers``): a trusted lane's template importing the
modules its jobs needed (``_worker.warm``), made for that if the lane has
none. A start asked for goes first; a warm-up only speeds later ones.
"""

from __future__ import annotations

import signal
import threading
import traceback
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from procq._core.channel import Launch, WorkerChannel
from procq._core.entries import LaneState, WorkerSlot
from procq._supervisor import log as _log
from procq._supervisor.channels import channel_kind, mark_starter_thread

if TYPE_CHECKING:
    from procq._core.core import Core
    from procq._supervisor.undertaker import Undertaker
    from procq._supervisor.wait import Timers, Watcher

__all__ = ["RESTART_BACKOFF", "Started", "Starter", "Starts"]

#: How long to wait before trying again to start a worker that failed to start.
RESTART_BACKOFF = 1.0

#: What a start came to: the lane, and the started channel or why it failed.
Started = tuple[LaneState, "WorkerChannel | BaseException"]


class Starter:
    """The starter thread, started on its first request, and what the I/O
    thread keeps of its starts (``in_flight``, touched by that thread only)."""

    def __init__(self, launch: Launch, name: str, wake: Callable[[], None]) -> None:
        self._launch = launch
        self._name = name
        self._wake = wake
        self._cond = threading.Condition()
        self._requests: deque[LaneState] = deque()  # under _cond
        self._warms: deque[LaneState] = deque()  # lanes to warm (WorkerChannel.warm), under _cond
        self._stopping = False  # under _cond
        # Filled by the starter thread, emptied by the I/O thread (a deque's
        # append and popleft are atomic).
        self._done: deque[Started] = deque()
        self._thread: threading.Thread | None = None
        # Starts asked for and not taken back yet, by lane name (I/O thread only).
        self.in_flight: dict[str, int] = {}

    def request(self, lane: LaneState, n: int = 1) -> None:
        """Start ``n`` processes for ``lane`` (from the I/O thread; never waits)."""
        self.in_flight[lane.name] = self.in_flight.get(lane.name, 0) + n
        with self._cond:
            self._requests.extend([lane] * n)
            self._cond.notify()
            self._started()

    def warm(self, lane: LaneState) -> None:
        """Run ``WorkerChannel.warm`` for ``lane`` after the starts asked for
        (any thread; never waits). Nothing once the starter is stopped."""
        with self._cond:
            if self._stopping or any(waiting is lane for waiting in self._warms):
                return
            self._warms.append(lane)
            self._cond.notify()
            self._started()

    def _started(self) -> None:
        """Start the thread on the first request (under ``_cond``). It blocks
        SIGINT itself, as the processes it starts must."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"procq-starter-{self._name}", daemon=True)
            self._thread.start()

    def take(self) -> list[Started]:
        """What the starter has handed back since the last call (I/O thread)."""
        taken: list[Started] = []
        done = self._done
        while done:
            item = done.popleft()
            self.in_flight[item[0].name] -= 1
            taken.append(item)
        return taken

    def stop(self) -> list[Started]:
        """Start nothing more; wait for the start under way, if any, and
        return every start not taken yet (I/O thread, as the queue stops)."""
        with self._cond:
            self._stopping = True
            for lane in self._requests:
                self.in_flight[lane.name] -= 1
            self._requests.clear()
            self._warms.clear()
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
        return self.take()

    def _run(self) -> None:
        mark_starter_thread()
        if hasattr(signal, "pthread_sigmask"):  # (see Supervisor._main: the children inherit it)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        cond, requests = self._cond, self._requests
        while True:
            with cond:
                while not requests and not self._warms and not self._stopping:
                    cond.wait()
                if self._stopping:
                    return
                warming = not requests  # starts first: a warm-up only speeds later ones
                lane = self._warms.popleft() if warming else requests.popleft()
            if warming:
                try:
                    channel_kind(lane).warm(lane, self._launch)
                except Exception:  # it only speeds later starts, which go on without it
                    traceback.print_exc()
                continue
            result: WorkerChannel | BaseException
            try:
                result = channel_kind(lane).start(lane, self._launch)
            except BaseException as exc:  # handed to the I/O thread, which decides
                if isinstance(exc, Exception):  # out of processes or memory, most likely
                    traceback.print_exc()
                result = exc
            self._done.append((lane, result))
            self._wake()


class Starts:
    """What the I/O thread starts, and what it does with each start's end.

    Every method is called on the I/O thread. ``halted()`` is true once the
    queue stops or is cancelled: nothing more is started then."""

    def __init__(
        self, core: Core, launch: Launch, name: str, watcher: Watcher, undertaker: Undertaker, timers: Timers,
        halted: Callable[[], bool],
    ) -> None:  # fmt: skip
        self._core = core
        self._launch = launch
        self._watcher = watcher
        self._undertaker = undertaker
        self._timers = timers
        self._halted = halted
        self._starter = Starter(launch, name, watcher.wake)
        launch.warmers.append(self._starter.warm)
        # Lanes whose spare failed to start: none is started again until a
        # process of the lane boots (``ready``), so a lane out of processes
        # does not spin asking for spares.
        self._spares_held: set[str] = set()

    def first(self, lane: LaneState) -> None:
        """Start one of ``lane``'s first workers, here and now: the queue
        opens with them, and a failure to start one refuses the queue."""
        self._register(lane, channel_kind(lane).start(lane, self._launch), reserved=False)

    def refill(self, lane: LaneState) -> None:
        """Start what ``lane`` wants (its reserved replacements, the spares it
        lacks: ``Core.starts_wanted``) and is not on its way already."""
        if self._halted():
            return
        core = self._core
        spares = not core.closing and lane.name not in self._spares_held
        if channel_kind(lane).starts_off_thread:
            missing = core.starts_wanted(lane, spares) - self._starter.in_flight.get(lane.name, 0)
            if missing > 0:
                self._starter.request(lane, missing)
            return
        for _ in range(core.starts_wanted(lane, False)):  # a kind that starts here: no spares
            try:
                channel = channel_kind(lane).start(lane, self._launch)
            except Exception:
                traceback.print_exc()
                self._failed(lane)
            else:
                self._register(lane, channel, reserved=True)

    def ready(self, lane: LaneState) -> None:
        """A process of ``lane`` said READY: it can start processes again."""
        self._spares_held.discard(lane.name)
        self.refill(lane)

    def take(self) -> None:
        """Register the processes the starter thread has started since the
        last call, or handle their failure to start."""
        # (Processes first: a reserved place they fill is not reported short.)
        taken = sorted(self._starter.take(), key=lambda item: isinstance(item[1], BaseException))
        for lane, result in taken:
            if not isinstance(result, BaseException):
                self._register(lane, result, reserved=True)
                continue
            if not isinstance(result, Exception):
                raise result
            # The start of a reserved replacement failed, unless the starts
            # still on their way are enough for those: then a spare's did.
            if self._core.starts_wanted(lane, False) > self._starter.in_flight.get(lane.name, 0):
                self._failed(lane)
            else:
                self._spares_held.add(lane.name)

    def stop(self) -> None:
        """The queue stops: start nothing more, and register what was being
        started, for ``stop_workers`` to stop and reap with the others."""
        for lane, result in self._starter.stop():
            if not isinstance(result, BaseException):
                self._register(lane, result, reserved=True)

    def _register(self, lane: LaneState, channel: WorkerChannel, reserved: bool) -> None:
        """Watch a started process: the undertaker learns its group, the
        selector its pipe and death, before its READY is read (so before it
        can run a job); the core files it as a worker or a spare."""
        self._undertaker.watch(channel.pid)
        worker = WorkerSlot(lane, channel)
        self._watcher.watch(worker)
        self._core.add_worker(worker, lane, reserved)
        _log.started(worker)

    def _failed(self, lane: LaneState) -> None:
        """A reserved replacement could not be started (out of processes or
        memory, most likely): the lane runs short until a later attempt
        succeeds, ``RESTART_BACKOFF`` from now."""
        _log.start_failed(lane, RESTART_BACKOFF)
        self._core.add_worker(None, lane, reserved=True)
        self._timers.retry_start(lane.name, self._core.clock() + RESTART_BACKOFF)
