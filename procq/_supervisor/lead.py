"""A caller that waits on its own job reads the job's answer itself.

Without this, one job's answer crosses two threads: the I/O thread wakes on
the worker's pipe, reads and settles the answer, then wakes the waiting
caller. Each wake-up is a thread switch (and, on a busy machine, often a
switch of CPU), which is most of a short job's round trip. So a caller that
waits (``JobHandle.result``) on a job a worker is running, while no other
thread reads that worker's pipe, becomes its reader for as long as it waits:

- it takes the worker's ``reading`` lock without blocking (someone else
  reading will settle the job, or let go: if that is the I/O thread, it waits
  on the event for a slice, then tries again; if it is another caller, it
  waits on the event alone: the I/O thread reads the pipe once that caller
  lets go, so many callers waiting on one job cost nothing while they wait);
- it takes a right to send (``WorkerSlot.sending``), so the pipe is not
  closed under it, and has the I/O thread's selector pass over the pipe;
- it waits for the pipe to be readable, in slices, so that a worker that is
  dying or doomed meanwhile is left to the I/O thread at once;
- it settles what it read as the I/O thread would (``Core.jobs_done``, the
  worker's next jobs sent, wake-ups delivered); whatever only the I/O thread
  may do (replace a retired worker, kill one that broke the protocol, start a
  decode) is handed to it (``later``), and the caller stops leading.

EOF is never consumed here: the caller lets go, and the I/O thread sees it on
its next wait (the selector is level-triggered). A death is the I/O thread's
to handle as always; before it reads what the dead worker left (``_drain``)
it takes the ``reading`` lock, which a leader lets go within one slice.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from procq._core.answers import Reported
from procq._core.entries import Entry, WorkerLife, WorkerSlot
from procq._wire.protocol import Event, Report, Undecoded

if TYPE_CHECKING:
    from procq._core.core import Core
    from procq._core.entries import Wakeup
    from procq._supervisor.wait import Watcher

__all__ = ["LEAD_SLICE", "Handoffs", "Leader", "ask_retire_over_rss"]

#: The longest a leading caller waits on the pipe before it looks again at
#: the worker's life (a dying worker's pipe may stay open in a stray child).
LEAD_SLICE = 0.05


class Leader:
    """Lets waiting callers read their workers' pipes (see the module's text)."""

    def __init__(self, core: Core, watcher: Watcher, handoffs: Handoffs, io: IOThread) -> None:
        self._core = core
        self._watcher = watcher
        self._handoffs = handoffs
        self._io = io

    def wait(self, entry: Entry, event: threading.Event, timeout: float | None) -> bool:
        """Wait up to ``timeout`` for ``entry`` to be settled (``event``),
        reading its worker's pipe here while this thread may; True once set."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not event.is_set():
            worker = getattr(entry, "worker", None)  # (a store's entry of another queue's job has none)
            if worker is None or not worker.channel.leadable or worker.life is not WorkerLife.READY:
                break
            reading = worker.reading
            if reading.acquire(blocking=False):
                wakeups: list[Wakeup] = []
                worker.led = True
                try:
                    going = self._lead(worker, entry, deadline, wakeups)
                finally:
                    worker.led = False
                    reading.release()
                # Woken with the pipe let go: a done callback that waits on
                # another job of this worker does not wait on this thread.
                self._core.deliver(wakeups)
                if not going:
                    break
                continue
            if worker.led:
                # Another caller leads: it settles the job, or lets go of the
                # pipe, which the I/O thread then reads. Waiting for the job
                # here, not trying again every slice, is what lets a thousand
                # callers wait on one job at no cost.
                break
            # The I/O thread reads it now: it settles the job, or lets go and this one leads.
            wait = LEAD_SLICE if deadline is None else min(LEAD_SLICE, deadline - time.monotonic())
            if wait <= 0:
                break
            event.wait(wait)
        if deadline is None:
            return event.wait()
        return event.wait(max(0.0, deadline - time.monotonic()))

    def _lead(self, worker: WorkerSlot, entry: Entry, deadline: float | None, wakeups: list[Wakeup]) -> bool:
        """One wait on the worker's pipe, and what it brought settled (its
        wake-ups in ``wakeups``, for the caller to run). False: stop leading
        (the job moved on, the worker is going, time is up)."""
        core = self._core
        with core.lock:
            if worker.life is not WorkerLife.READY or entry.worker is not worker:
                return False
            worker.sending += 1  # the pipe stays open while this thread reads it
        try:
            if not self._watcher.pause(worker):
                return False
            try:
                # Past the deadline, still a look without waiting: a caller
                # that polls with result(timeout=0) holds this lock whenever
                # the I/O thread looks, so it must read the answer itself.
                wait = LEAD_SLICE if deadline is None else min(LEAD_SLICE, max(0.0, deadline - time.monotonic()))
                if not worker.channel.wait_readable(wait):
                    return deadline is None or time.monotonic() < deadline
                try:
                    events = worker.channel.read(worker)
                except EOFError:
                    return False  # the I/O thread sees it too, and handles the death
                return self._act(worker, events, wakeups)
            finally:
                self._watcher.resume(worker)
        finally:
            if core.sent(worker):
                self._handoffs.close(worker)

    def _act(self, worker: WorkerSlot, events: list[Event], wakeups: list[Wakeup]) -> bool:
        """Settle the reports read, as the I/O thread would; hand it whatever
        else. False once something was handed over (stop leading)."""
        if not events:
            return True
        io, later = self._io, self._handoffs.later
        if any(type(event) is not Report for event in events):
            later(worker, lambda: io.act(worker, events))
            return False
        reports: list[Report] = events  # type: ignore[assignment]  # (all Reports: checked above)
        ask_retire_over_rss(worker, reports)
        core = self._core
        undecoded: list[tuple[Entry, Undecoded]] = []
        batch, status, taken = core.jobs_done(worker, reports, wakeups, undecoded)
        going = True
        if undecoded:
            later(None, lambda: io.decode(worker, undecoded))
            going = False
        if batch:
            worker.channel.send_jobs(core, worker, batch)
        elif status is not Reported.DONE:
            later(worker, lambda: io.after_settle(worker, reports, status, taken))
            going = False
        # A job started here (sent ahead) may have a time limit or a memory
        # limit, a failure may be due again after its backoff: the I/O thread
        # must not sleep past what it now has to do.
        deadline = core.next_deadline()
        if going and (core.memory_jobs or (deadline is not None and deadline < io.asleep_until)):
            self._watcher.wake()
        return going


def ask_retire_over_rss(worker: WorkerSlot, reports: list[Report]) -> None:
    """A worker past its lane's ``max_worker_rss`` after the jobs it reported
    is to be replaced after the last of them (by whichever thread settles them)."""
    limit = worker.lane.spec.max_worker_rss_bytes
    if limit is not None and worker.channel.rss() > limit:
        reports[-1] = reports[-1]._replace(retire=True)


class Handoffs:
    """What leaders hand to the I/O thread, run there in order (``run``)."""

    def __init__(self, watcher: Watcher) -> None:
        self._watcher = watcher
        self._later: deque[tuple[WorkerSlot | None, Callable[[], object]]] = deque()
        self._lock = threading.Lock()
        self._finished = False  # (under _lock) the I/O thread is gone: nothing more runs there

    def later(self, worker: WorkerSlot | None, action: Callable[[], object]) -> None:
        """Run ``action`` on the I/O thread soon (from any thread), unless
        ``worker`` is given and no longer watched by then."""
        self._later.append((worker, action))
        self._watcher.wake()

    def close(self, worker: WorkerSlot) -> None:
        """Close the pipe of a worker that died or was retired (or whose queue
        stopped) while a waiting caller read it, that caller being its last
        sender: on the I/O thread, which first stops watching it (a closed
        descriptor cannot be taken out of the selector), or here once that
        thread is gone."""
        with self._lock:
            if not self._finished:
                self.later(None, lambda: self._close_unwatched(worker))
                return
        worker.channel.close()

    def _close_unwatched(self, worker: WorkerSlot) -> None:
        self._watcher.unwatch(worker.channel.messages)
        worker.channel.close()

    def run(self) -> None:
        """On the I/O thread: what was handed over, in order."""
        later, watched = self._later, self._watcher.watched
        while later:
            worker, action = later.popleft()
            if worker is None or watched(worker):
                action()

    def finish(self) -> None:
        """The I/O thread stops: the pipes handed back to it are closed now;
        any later, by the leader that hands them back."""
        with self._lock:
            self._finished = True
            left = [action for worker, action in self._later if worker is None]
            self._later.clear()
        for action in left:
            action()


class IOThread(Protocol):
    """What only the I/O thread may do with what a leader read (``Supervisor``)."""

    #: When its wait ends at the latest (``Core.clock``; infinity while it is not waiting).
    asleep_until: float

    def act(self, worker: WorkerSlot, events: list[Event]) -> bool: ...

    def decode(self, worker: WorkerSlot, undecoded: list[tuple[Entry, Undecoded]]) -> None: ...

    def after_settle(self, worker: WorkerSlot, reports: list[Report], status: Reported, taken: int) -> bool: ...
