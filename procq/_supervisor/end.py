"""How the I/O thread ends workers: a pipe at EOF, a protocol violation, a
retirement between jobs, a death, a kill with a grace (``Endings``).

Every worker ends in ``on_death``, once its process sentinel fires: the other
paths only doom it, take its pipe out of the selector and arrange for it to
exit or be killed. The order inside ``on_death`` is what keeps its promises:
the group is killed before anything is read (nothing it left behind runs on),
what it wrote before dying still counts (the drain), its pipe leaves the
selector before the core marks it dead (from then on the last sender closes
it), its waiters are woken before its replacement is asked for.
"""

from __future__ import annotations

from collections.abc import Callable

from procq._core.core import Core, WorkerLife, WorkerSlot
from procq._core.dispatch import UNSTARTED_DEATHS_TO_FAIL
from procq._supervisor import log as _log
from procq._supervisor.failures import crash_failure, protocol_failure, start_failure
from procq._supervisor.start import Starts
from procq._supervisor.undertaker import Undertaker
from procq._supervisor.wait import STOP_GRACE, Timers, Watcher

__all__ = ["EOF_GRACE", "Endings"]

#: How long a worker whose pipe reached EOF may live on before it is killed.
EOF_GRACE = 1.0
#: Backoff before starting again after a worker died while starting: doubles
#: with each one in a row, up to the maximum.
BOOT_BACKOFF = 0.05
BOOT_BACKOFF_MAX = 5.0
#: After this many workers in a row died while starting, a lane's waiting jobs
#: fail; as many deaths before a job a worker was given started fail that job.
BOOT_FAILURES_TO_FAIL_JOBS = UNSTARTED_DEATHS_TO_FAIL


class Endings:
    """The I/O thread's ways to end a worker (all run on that thread)."""

    def __init__(
        self, core: Core, watcher: Watcher, timers: Timers, starts: Starts, undertaker: Undertaker,
        drain: Callable[[WorkerSlot], None], send_handoffs: Callable[[], None], halted: Callable[[], bool],
    ) -> None:  # fmt: skip
        self.core = core
        self.clock = core.clock
        self._watcher = watcher
        self._timers = timers
        self._starts = starts
        self._undertaker = undertaker
        self._drain = drain  # act on whatever a dead worker wrote before it died
        self._send_handoffs = send_handoffs  # jobs the core gave promoted spares meanwhile
        self._halted = halted  # nothing more is started: the queue is stopping or cancelled

    def on_eof(self, worker: WorkerSlot) -> None:
        """The worker's end of the pipe closed. Usually it is dying and its
        sentinel follows at once (under forkserver, once the server has reaped
        it); a worker that closed its pipe and lives on is killed after a grace.
        Either way its death is handled by ``on_death`` when the sentinel fires."""
        self.core.doom(worker)
        self._watcher.unwatch(worker.channel.messages)
        self._timers.kill_at[worker] = self.clock() + EOF_GRACE

    def eof_overdue(self, worker: WorkerSlot) -> None:
        """A worker lives on after its pipe closed (or after it was retired):
        kill it. Holding a job, it broke the protocol: a worker only closes
        its pipe by exiting."""
        entry = worker.entry
        if entry is not None and worker.life is not WorkerLife.RETIRED:
            what = f"closing its pipe and running on ({EOF_GRACE:g}s later it was still alive, and was killed)"
            _log.violation(worker, entry, what)
            self.core.decide_kill(worker, entry, protocol_failure(worker, entry, what))
        worker.channel.kill()

    def violation(self, worker: WorkerSlot, what: str) -> None:
        """The worker broke the protocol: fail its job (if it holds one) with
        kind "protocol", kill it, and let ``on_death`` replace it."""
        entry = worker.entry
        _log.violation(worker, entry, what)
        if entry is not None:
            self.core.decide_kill(worker, entry, protocol_failure(worker, entry, what))
        self.core.doom(worker)
        self._watcher.unwatch(worker.channel.messages)
        worker.channel.kill()

    def retire(self, worker: WorkerSlot) -> None:
        """Replace a worker between jobs (the core has made it RETIRED): close
        its pipe (it exits on EOF), and start its replacement at once."""
        self._watcher.unwatch(worker.channel.messages)
        with self.core.lock:  # (from now on the last sender closes it: Core.sent)
            worker.unwatched = True
            close_now = worker.sending == 0
        if close_now:
            worker.channel.close()
        self._timers.kill_at[worker] = self.clock() + STOP_GRACE
        _log.retired(worker)
        self._send_handoffs()  # (a promoted spare's job)
        self._starts.refill(worker.lane)

    def on_death(self, worker: WorkerSlot) -> None:
        """Handle a worker that died, or whose pipe reached EOF."""
        core = self.core
        core.doom(worker)  # from now on it gets no job
        channel = worker.channel
        # Whatever it left behind in its process group goes with it.
        channel.kill_group()
        # A result written just before the death still counts.
        self._drain(worker)
        self._timers.kill_at.pop(worker, None)  # (after the drain, which may see EOF and set it)
        self._undertaker.forget(channel.pid)  # (before the reap: then its group id may be reused)
        exitcode = channel.reap()
        crash, sig, how = crash_failure(worker, exitcode)
        # After the drain (a report it wrote moves its job on): which job it
        # had started, so that one it was given but never began is not blamed.
        last_started = channel.last_started()
        lane = worker.lane
        stopping = self._halted() or (core.closing and core.drained.is_set())
        # Read before worker_died makes it DEAD and takes its job (boot_failures: only this thread changes it).
        retired, booting, held = worker.life is WorkerLife.RETIRED, worker.life.booting, worker.entry
        spare = worker.spare  # (a spare is not replaced: the lane refills its spares below)
        replace_now = not stopping and not booting and not lane.boot_failures and not retired and not spare
        # Unwatched before worker_died makes it DEAD: from then on the last
        # thread holding a right to send closes the pipe (Core.sent), and a
        # closed pipe cannot be taken out of the selector.
        self._watcher.unwatch(channel.messages)
        self._watcher.unwatch(channel.sentinel)
        unstarted_before = 0 if held is None else held.unstarted  # (the core counts one it did not start)
        close_now, wakeups = core.worker_died(worker, crash, exitcode, sig, replace_now, last_started)
        began = held is None or held.unstarted == unstarted_before
        quiet = stopping or retired or booting
        _log.died(worker, held if began else None, how, sig, exitcode, quiet, None if began else held)
        if close_now:
            channel.close()
        channel.release()
        # Waiters first, then the dead worker's queued jobs and a promoted
        # spare's job; the lane already counts the replacement as alive.
        core.deliver(wakeups)
        self._send_handoffs()
        if replace_now:
            _log.restart(lane, how)
        self._starts.refill(lane)  # (on the starter thread: see _supervisor_start)
        if not (replace_now or stopping or retired or spare):
            # Dying while starting is no job's fault, and starting again at
            # once would spin: back off, and after a few in a row fail the
            # jobs waiting for this lane rather than let them wait forever.
            failures = lane.boot_failures
            delay = min(BOOT_BACKOFF * 2 ** (failures - 1), BOOT_BACKOFF_MAX)
            self._timers.retry_start(lane.name, self.clock() + delay)
            _log.backoff(lane, failures, delay, how, failures >= BOOT_FAILURES_TO_FAIL_JOBS)
            if failures >= BOOT_FAILURES_TO_FAIL_JOBS:
                core.fail_waiting(lane, start_failure(lane, failures, how, exitcode))

    def terminate(self, worker: WorkerSlot) -> None:
        """End a worker's process tree: SIGTERM now (the job may clean up),
        SIGKILL to whatever is left after its lane's ``kill_grace``. Once the
        queue closes without waiting (``Core.cancelled``), SIGKILL at once:
        that close promises to be done within a second, whatever the grace."""
        grace = worker.lane.spec.kill_grace
        if worker.life is WorkerLife.DEAD:
            return
        if grace <= 0 or self.core.cancelled:
            worker.channel.kill()
            return
        descendants = worker.channel.terminate()
        self._timers.kill_later(self.clock() + grace, worker, descendants)

    def cut_graces(self) -> None:
        """The queue closes without waiting: every tree still in the grace
        after its SIGTERM is SIGKILLed now, not when its grace ends (which
        may be an hour away). Its job's end was decided when it was
        terminated; the worker's death, seen as any other, ends it."""
        for _, worker, descendants in self._timers.take_kills():
            worker.channel.kill(descendants)
