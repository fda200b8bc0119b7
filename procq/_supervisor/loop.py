"""The supervisor's I/O side: worker channels, deaths and deadlines.

Who owns what, and what each pipe carries::

    caller threads / asyncio tasks             supervisor I/O thread (one per queue)
    ------------------------------             -------------------------------------
    push(): claim in Core ──────────┐          one epoll selector on, all at once:
      serialize fn + args           │            - every worker channel's pipe (messages)
      Core.offer():                 │            - every worker's pidfd        (deaths)
        idle worker? send the job   │            - the wake-up pipe            (close, cancel, new deadline)
        on its channel ─────────────┼──┐         with the nearest deadline as timeout (job time
        else wait in the lane       │  │         limits, due times, SIGKILLs due after a SIGTERM,
    handle.result() / await ────────┘  │         memory samples, restarts, EOF graces)
      wait for the entry's event       │       on messages: channel.read() -> events, in order:
    q.cancel(key): Core.cancel ────────┤         Ready:     Core.worker_ready -> send it a waiting job
      (sent ahead? a CANCEL frame ─────┼──┐      Reports:   all that arrived settled at once
       to that worker, from here)      │  │                 (Core.jobs_done); then one frame of next
                                       │  │                 jobs (several ahead while the lane's jobs
                                       │  │                 are short and wait), or retire the worker
                                       │  │                 and start another; then wake-ups. An
                                       │  │                 Undecoded outcome (its unpickling may run
                                       │  │                 code, or it is large) frees the worker; the
                                       │  │                 job stays Processing until the lane's decode
                                       │  │                 thread settles it (Core.decoded)
                                       │  │      DecodeLater: a large untrusted message, decoded on
                                       │  │                 that thread, back here to be checked in order
                                       │  │      Violation: fail the job ("protocol"), kill the worker
                                       │  │    on a death:   Core.worker_died -> SIGKILL its group,
                                       │  │                  wake the dead job's waiters (a job it had not
                                       │  │                  started, by its start mark, is no dead job:
                                       │  │                  it goes back), its jobs sent
                                       │  │                  ahead back to their lane, replace it: by a
                                       │  │                  warm spare at once if the lane has one
                                       │  │                  (``_core.spares``), and ask the starter thread
                                       │  │                  for what the lane lacks now
                                       │  │    on a start:   (the starter thread's wake-up) watch and
                                       │  │                  register each process it started
                                       │  │    (a failed attempt with a Retry left is not ended:
                                       │  │     Core re-times it for its backoff; no wake-up)
                                       │  │    on a due time: Core.due -> the job enters its lane
                                       │  │                   (an idle worker? send it the job)
                                       │  │    on a deadline, a cancel: SIGTERM the worker's tree,
                                       │  │                  SIGKILL after the lane's kill_grace (at
                                       │  │                  once when closing without waiting, which
                                       │  │                  also cuts short every grace running)
                                       v  v    on memory past a limit: SIGKILL the worker's tree
                       WorkerChannel, one per worker (``_supervisor.channels``): its pipe, process, sentinel
                         TrustedChannel:   multiprocessing child (``_worker.trusted``), pickled answers
                                           read in bulk, each naming its job in a trailer;
                                           unpickled here only where that runs no code
                         UntrustedChannel: fresh `python -I` (``_worker.untrusted``) that forks
                                           a process per job and relays its JSON answer, then
                                           its exit; read by a non-blocking FrameReader and
                                           checked message by message; a job ends at its exit.
                                           Sandboxed: it waits outside the namespaces of the
                                           worker it forks (pid 1 there, ``_system.sandbox_linux``)
                         DaskChannel:      one slot of a Dask lane: a job at a time, a task on
                                           the cluster (``_cluster.channel``, ``_cluster.remote``)
                       worker process (one pipe each; nothing shared)
                         starts -> sets up (cwd, env, rlimits, closes inherited fds) -> READY
                         RUN / RUN_MANY frame -> run each job under its limits, in order;
                         before each, any CANCEL that has arrived -> OK / ERROR / SKIPPED

``Core`` (``_core.core``) owns every entry and each worker's bookkeeping
(``WorkerSlot``), under its lock; this thread owns the channels, the selector
and its own timers. The I/O thread watches, registers and reaps every
worker; the processes themselves are started by the queue's starter thread
(``_supervisor.start``: a ``Process.start()`` takes milliseconds, which would
stall every death, read and send here), so a worker's parent (or, under
forkserver, the forkserver's parent) is the supervisor for as long as the
queue lives. The thread that sends a job on a
worker's channel is whichever one assigned it: ``Dispatch._assign`` gives a thread
the right to send (``WorkerSlot.sending``) until that thread calls
``Core.sent``, and a pipe is only closed when no thread holds that right, so a
descriptor is never closed, reused and written to by a late sender. Frames are
written whole under the channel's ``write_lock`` (a CANCEL from ``q.cancel``
may meet the I/O thread's next jobs there).

Why not a thread hop for every send: a push that finds an idle worker sending
itself saves a wake-up of this thread and a context switch per job, which is
most of a tiny job's latency; nor for an answer: a caller waiting on its job
may read the worker's pipe itself (``_supervisor.lead``). Why not poll: the selector wakes on exactly the
events above and sleeps otherwise. Why several jobs in flight to a busy
worker: with one, the worker waits for the supervisor between every two jobs,
and the supervisor pays a wake-up, a read and a write for each; with several,
both sides work in bulk (see ``Dispatch._top_up``). Why pidfds rather than
``multiprocessing``'s sentinels: a sentinel is a pipe the worker holds open,
so a job's child that inherited it would hide the worker's death for as long
as the child lived. Why an untrusted worker is never read with
``recv_bytes``: it blocks until a frame is whole, so a worker that wrote half
a frame and stopped would stall this thread and every lane with it.

Beside it: ``_supervisor.start`` (the starter thread, and what to start),
``_supervisor.end`` (how a worker is ended: EOF, violation, retirement, death, kill),
``_supervisor.wait`` (selector, wake-ups, timers, the last wait), ``_supervisor.lead``,
``_supervisor.decode``, ``_supervisor.failures``, ``_supervisor.log`` (what it logs as
it decides), ``_supervisor.channels`` and its kinds, ``_system.processes``. Should this thread
die of an exception, the queue closes itself, saying why (``Core.break_down``).
"""

from __future__ import annotations

import math
import os
import signal
import threading
import traceback
from typing import Any

# Each local kind of worker registers its channel class in KINDS as it is imported.
import procq._supervisor.channel_trusted
import procq._supervisor.channel_untrusted  # noqa: F401
from procq._core.answers import Reported
from procq._core.channel import Launch
from procq._core.core import Core, Entry, WorkerLife, WorkerSlot
from procq._core.entries import Wakeup
from procq._supervisor import log as _log
from procq._supervisor.channels import channel_kind
from procq._supervisor.decode import Decoders
from procq._supervisor.end import Endings
from procq._supervisor.lead import Handoffs, Leader, ask_retire_over_rss
from procq._supervisor.start import Starts
from procq._supervisor.undertaker import Undertaker
from procq._supervisor.wait import MEMORY_CHECK_INTERVAL, Timers, Watcher, check_memory, stop_workers
from procq._system.processes import next_sample
from procq._wire.protocol import DecodeLater, Event, Ready, Report, Undecoded, Violation

__all__ = ["Supervisor"]


class Supervisor:
    """Starts, watches and reaps one queue's workers on a thread of its own."""

    def __init__(self, core: Core, context: Any, name: str) -> None:
        self.core = core
        self.name = name
        # Time as the core reads it: its deadlines and timers are compared with this.
        self.clock = core.clock
        # Untrusted workers watch the read end: it reaches EOF when this
        # process dies, since only this process holds the write end.
        self._alive_r, self._alive_w = os.pipe()
        self._launch = Launch(context, name, self._alive_r)
        self._undertaker = Undertaker()  # kills the workers' groups should this process die
        self._watcher = Watcher()
        self.wake = self._watcher.wake  # from any thread
        self._timers = Timers()
        # Decode threads, for what this thread must not decode itself (see _supervisor_decode).
        self._decoders = Decoders(core, name, self.wake)
        self._undecoded: list[tuple[Entry, Undecoded]] = []  # (reused: filled by Core.jobs_done)
        # What waiting callers that read their workers' pipes hand to this thread (``_supervisor.lead``).
        self._handoffs = Handoffs(self._watcher)
        core.lead = Leader(core, self._watcher, self._handoffs, self).wait
        # Workers whose running job q.cancel() ended, to be killed by the I/O thread.
        self._pending_terminations: list[tuple[WorkerSlot, Entry]] = []
        self._stop = False
        self._cancel = False
        # When this thread's wait ends at the latest (``Core.clock``), for a leader
        # whose settle gave a job a deadline or a due time (``_supervisor.lead``).
        self.asleep_until = math.inf
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=f"procq-supervisor-{name}", daemon=True)
        core.on_new_deadline = self.wake
        self._starts = Starts(core, self._launch, name, self._watcher, self._undertaker, self._timers, self._halted)
        self._ends = Endings(
            core, self._watcher, self._timers, self._starts, self._undertaker, self._drain, self._send_handoffs,
            self._halted,
        )  # fmt: skip

    # --- control, from any thread ---------------------------------------------

    def start(self) -> None:
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            self._thread.join()
            raise self._start_error

    def cancel_all(self) -> None:
        """Cancel waiting jobs and kill running ones (close without waiting)."""
        self._cancel = True
        self.wake()

    def cancel(self, key: str) -> bool:
        """``q.cancel(key)``: the core decides; a running job's tree is killed
        by the I/O thread, and a worker that holds the job unstarted is told
        to skip it, from here, before ``cancel`` returns. Nothing is sent to
        a worker that is gone or going."""
        core = self.core
        cancelled, kill, skip = core.cancel(key)
        if kill is not None:
            self._pending_terminations.append(kill)
            self.wake()
        if skip is not None:
            worker, job_id = skip
            with core.lock:
                if worker.life is not WorkerLife.READY:  # gone or going
                    return cancelled
                worker.sending += 1
            worker.channel.send_skip(core, worker, job_id)
        return cancelled

    def stop(self) -> None:
        """Stop every worker and the I/O thread; returns once all are reaped."""
        self._stop = True
        self.wake()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def pids(self) -> list[int]:
        with self.core.lock:
            return [w.pid for lane in self.core.lanes.values() for w in lane.workers if w.pid]

    # --- the I/O thread ---------------------------------------------------------

    def _main(self) -> None:
        if hasattr(signal, "pthread_sigmask"):
            # Children inherit this thread's signal mask: a worker (or the
            # forkserver, if this thread starts it) boots with SIGINT blocked
            # until it has set it to be ignored. Python runs signal handlers in
            # the main thread, so blocking SIGINT here changes nothing else.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for lane in self.core.lanes.values():
                for _ in range(lane.spec.workers):
                    self._starts.first(lane)
        except BaseException as exc:
            self._start_error = exc
            self._shutdown()
            self._started.set()
            return
        self._started.set()
        try:
            self._loop()
        except BaseException as exc:
            # A bug, or what the loop cannot survive: the queue says so at once (closed,
            # pushes refused with this as their cause); no handle hangs, no worker outlives it.
            traceback.print_exc()
            self.core.break_down(exc)
            why = f"was cancelled: procq's supervisor thread died ({type(exc).__name__}: {exc})"
            self._kill_all(self.core.cancel_all(why))
        finally:
            self._shutdown()

    def _loop(self) -> None:
        core, timers, watcher = self.core, self._timers, self._watcher
        while not self._stop:
            if self._cancel:
                self._cancel = False
                self._kill_all(core.cancel_all("was cancelled: the queue was closed without waiting"))
                self._ends.cut_graces()  # (trees a cancel or a timeout ended before, still in their grace)
            while self._pending_terminations:  # from q.cancel(), on other threads
                self._cancel_running(*self._pending_terminations.pop())
            self._handoffs.run()
            self.asleep_until = math.inf  # (a leader's new deadline until then wakes this thread: see below)
            now = self.clock()
            timeout = timers.timeout(core.next_deadline(), core.memory_jobs > 0, now)
            self.asleep_until = math.inf if timeout is None else now + timeout
            for worker, messages in watcher.select(timeout):
                if messages:
                    self._read(worker)
                else:
                    self._ends.on_death(worker)
            self._starts.take()  # processes the starter thread started
            while self._decoders.decoded:
                worker, decoded = self._decoders.decoded.popleft()
                if watcher.watched(worker):  # (else it broke, closed or died: nothing more of it counts)
                    self.act(worker, worker.channel.resume(worker, decoded))
            now = self.clock()
            for worker in core.expired(now):
                _log.timeout_kill(worker, worker.entry)
                self._ends.terminate(worker)
            for worker, entry in core.due(now):
                worker.channel.send_job(core, worker, entry)
            if core.memory_jobs and timers.sample_due(now):
                check_memory(core)
                timers.next_sample = next_sample(now, self.clock(), MEMORY_CHECK_INTERVAL)
            for worker in timers.overdue(now):
                self._ends.eof_overdue(worker)
            for worker, descendants in timers.kills_due(now):
                worker.channel.kill(descendants)
            if not (self._stop or core.cancelled):
                for name in timers.starts_due(now):
                    lane = core.lanes[name]
                    core.reserve_restart(lane)
                    self._send_handoffs()  # (a promoted spare's job)
                    self._starts.refill(lane)

    def _cancel_running(self, worker: WorkerSlot, entry: Entry) -> None:
        """Kill the worker of a job ``q.cancel`` ended while it ran, unless
        the job ended first and the worker has moved on (``Core.spare``)."""
        kill, batch = self.core.spare(worker, entry) if self._watcher.watched(worker) else (True, [])
        if kill:
            _log.cancelled(worker, entry)
            self._ends.terminate(worker)
        elif batch:
            worker.channel.send_jobs(self.core, worker, batch)

    # --- workers -------------------------------------------------------------

    def _send_handoffs(self) -> None:
        """Send the jobs the core gave idle workers or promoted spares meanwhile."""
        for idle, entry in self.core.handoffs():
            idle.channel.send_job(self.core, idle, entry)

    def _read(self, worker: WorkerSlot, wait: bool = False) -> bool:
        """Read and act on what the worker sent, unless a waiting caller is
        reading it (``_supervisor.lead``; ``wait``: wait for it to let go).
        False once nothing more can be read from it (EOF, or it broke the protocol).

        Every report that has arrived is settled at once, then the jobs they
        freed room for go to the same worker in one frame. Waiters are woken
        after that, once for them all: a thread waiting on many handles wakes
        once per read, not once per job."""
        reading = worker.reading
        if not reading.acquire(blocking=wait):
            return True
        try:
            try:
                events = worker.channel.read(worker)
            except EOFError:
                self._ends.on_eof(worker)
                return False
            return self.act(worker, events) and bool(events)
        finally:
            reading.release()

    def act(self, worker: WorkerSlot, events: list[Event]) -> bool:
        """Act on a worker's events, in order (see ``_read``). False once
        nothing more must be read from it (it broke the protocol)."""
        wakeups: list[Wakeup] = []
        reports: list[Report] = []
        going = True
        for event in events:
            if type(event) is Report:
                reports.append(event)
                continue
            if reports:
                going = self._settle(worker, reports, wakeups)
                reports = []
            if not going:
                break
            if type(event) is Ready:
                going = self._on_ready(worker)
            elif type(event) is DecodeLater:  # (always the last event of a read)
                self._decoders.message(worker, event.decode)
            else:
                assert type(event) is Violation
                self._ends.violation(worker, event.what)
                going = False
        if reports:
            going = self._settle(worker, reports, wakeups)
        self.core.deliver(wakeups)
        return going

    def _settle(self, worker: WorkerSlot, reports: list[Report], wakeups: list[Wakeup]) -> bool:
        """Settle the reports read at once, then send the worker its next jobs
        or retire it. False if a report broke the protocol."""
        ask_retire_over_rss(worker, reports)
        undecoded = self._undecoded
        batch, status, taken = self.core.jobs_done(worker, reports, wakeups, undecoded)
        if undecoded:
            self.decode(worker, undecoded)
            undecoded.clear()
        if batch:  # (only ever with Reported.DONE)
            worker.channel.send_jobs(self.core, worker, batch)
            return True
        return self.after_settle(worker, reports, status, taken)

    def decode(self, worker: WorkerSlot, undecoded: list[tuple[Entry, Undecoded]]) -> None:
        """Settle outcomes that need decoding on the lane's decode thread."""
        self._decoders.lane(worker.lane).outcomes(undecoded)

    def after_settle(self, worker: WorkerSlot, reports: list[Report], status: Reported, taken: int) -> bool:
        """Retire the worker, or fail it for a report about another job, as
        its settled reports asked. False if a report broke the protocol."""
        if status is Reported.RETIRE:
            self._ends.retire(worker)
        elif status is Reported.UNEXPECTED:
            held = worker.entry
            what = "while it held no job" if held is None else f"while it held job {held.key!r}"
            self._ends.violation(worker, f"a message about job id {reports[taken].job_id} {what}")
            return False
        return True

    def _on_ready(self, worker: WorkerSlot) -> bool:
        """The worker finished starting: send it a waiting job, if any."""
        if not worker.life.booting:
            self._ends.violation(worker, "a second READY message")
            return False
        # Before the first job can run (every job runs on a worker that said
        # READY), and not sooner: its interpreter's start would compete for
        # the CPU with the queue's first workers as they boot.
        self._undertaker.start()
        ready = self.core.worker_ready(worker)
        if ready is not None:
            worker.channel.send_job(self.core, worker, ready)
        self._starts.ready(worker.lane)  # (its next spare, or starts held back after a failed boot)
        return True

    def _drain(self, worker: WorkerSlot) -> None:
        """Act on whatever a dead worker wrote before it died."""
        try:
            while self._watcher.watched(worker) and self._read(worker, wait=True):
                pass
        except (EOFError, OSError):
            pass

    def _halted(self) -> bool:  # (nothing more is started)
        return self._stop or self.core.cancelled

    def _hurried(self) -> bool:
        return self._cancel or self.core.cancelled

    def _kill_all(self, workers: list[WorkerSlot]) -> None:
        for worker in workers:
            worker.channel.kill()

    def _shutdown(self) -> None:
        """Stop every worker and reap it (``stop_workers``), then close what this thread owns."""
        self.core.stop()
        if self.core.live_count():  # only if the loop failed: nothing may hang
            self._kill_all(self.core.cancel_all("was cancelled: the queue's supervisor stopped"))
        self._starts.stop()  # (what it was starting is now watched: stopped and reaped below)
        stop_workers(self.core, self._watcher, self._timers, self._hurried, self._undertaker.forget)
        try:
            for lane in self.core.lanes.values():
                channel_kind(lane).close_lane(lane, self._launch)
            self._handoffs.finish()
            self._decoders.close()
        finally:  # (every worker is reaped: whatever fails now, the undertaker must not outlive the queue)
            self._watcher.close()
            self._undertaker.stop()
            os.close(self._alive_r)
            os.close(self._alive_w)
