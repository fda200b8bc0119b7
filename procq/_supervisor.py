"""The supervisor's I/O side: worker processes, their pipes, deaths and deadlines.

Who owns what, and what each pipe carries::

    caller threads / asyncio tasks             supervisor I/O thread (one per queue)
    ------------------------------             -------------------------------------
    push(): claim in Core ──────────┐          one epoll selector on, all at once:
      serialize fn + args           │            - every worker's pipe     (results)
      Core.offer():                 │            - every worker's pidfd    (deaths)
        idle worker? send the job   │            - the wake-up pipe        (close, cancel, new deadline)
        directly on its pipe ───────┼──┐         with the nearest deadline as timeout (job time
        else wait in the lane       │  │         limits, due times, SIGKILLs due after a SIGTERM,
    handle.result() / await ────────┘  │         memory samples)
      wait for the entry's event       │       on READY:     Core.worker_ready -> send it a waiting job
    q.cancel(key): Core.cancel ────────┤       on results:   every report that has arrived, settled at
      (sent ahead? a CANCEL frame ─────┼──┐                  once (Core.jobs_done); then one frame of
       to that worker, from here)      │  │                  next jobs (several ahead while the lane's
                                       │  │                  jobs are short and wait), or retire the
                                       │  │                  worker and start another; then wake-ups
                                       │  │    on a death:   Core.worker_died -> SIGKILL its group,
                                       │  │                  wake the dead job's waiters, its jobs sent
                                       │  │                  ahead back to their lane, replace it
                                       │  │    (a failed attempt with a Retry left is not ended:
                                       │  │     Core re-times it for its backoff; no wake-up)
                                       │  │    on a due time: Core.due -> the job enters its lane
                                       │  │                   (an idle worker? send it the job)
                                       │  │    on a deadline, a cancel, memory past a limit:
                                       │  │                  SIGTERM the worker's tree, SIGKILL after
                                       │  │                  the lane's kill_grace
                                       │  │    on a protocol violation: fail the job ("protocol"), kill
                                       v  v
                       worker process (one pipe each; nothing shared)
                         starts -> sets up (cwd, env, rlimits, closes inherited fds) -> READY
                         RUN / RUN_MANY frame -> run each job under its limits, in order;
                         before each, any CANCEL that has arrived -> OK / ERROR / SKIPPED
                         (trusted lanes: multiprocessing child, pickled answers, read in
                          bulk; untrusted lanes: fresh `python -I` via subprocess that forks a
                          process per job and relays its JSON answer, then its exit;
                          read by a non-blocking FrameReader and checked message by
                          message; the job is settled at its process's exit)

The I/O thread starts and reaps every worker process, so a worker's parent (or,
under forkserver, the forkserver's parent) is the supervisor for as long as the
queue lives. The thread that sends a job on a worker's pipe is whichever one
assigned it: ``Dispatch._assign`` gives a thread the right to send
(``WorkerSlot.sending``) until that thread calls ``Core.sent``, and a pipe is
only closed when no thread holds that right, so a descriptor is never closed,
reused and written to by a late sender. Frames are written whole under the
worker's ``write_lock`` (a CANCEL from ``q.cancel`` may meet the I/O thread's
next jobs there).

Why not a thread hop for every send: a push that finds an idle worker sending
itself saves a wake-up of this thread and a context switch per job, which is
most of a tiny job's latency. Why not poll: the selector wakes on exactly the
events above and sleeps otherwise. Why several jobs in flight to a busy
worker: with one, the worker waits for the supervisor between every two jobs,
and the supervisor pays a wake-up, a read and a write for each; with several,
both sides work in bulk (see ``Dispatch._top_up``). Why pidfds rather than
``multiprocessing``'s sentinels: a sentinel is a pipe the worker holds open,
so a job's child that inherited it would hide the worker's death for as long
as the child lived. Why an untrusted worker is never read with
``recv_bytes``: it blocks until a frame is whole, so a worker that wrote half
a frame and stopped would stall this thread and every lane with it.

Beside this module: ``_supervisor_untrusted`` (the ``UntrustedWorkers`` mixin:
starting and reading untrusted lanes' workers), ``_messages`` (sending jobs,
reading trusted reports) and ``_processes`` (a worker's death, memory and
process tree).
"""

from __future__ import annotations

import os
import selectors
import signal
import threading
import time
import traceback
from multiprocessing.connection import wait
from typing import Any, Callable

from procq._core import Core, Entry, LaneState, WorkerLife, WorkerSlot, run_wakeups
from procq._messages import (
    close_worker_pipe,
    decode_trusted,
    over_rss,
    protocol_failure,
    report,
    send_job,
    send_jobs,
    send_skip,
)
from procq._processes import (
    children_map,
    close_sentinel,
    describe_exit,
    find_descendants,
    pidfd,
    signal_group,
    signal_worker,
    tree_rss,
    worker_config,
)
from procq._protocol import (
    FrameReader,
)
from procq._supervisor_untrusted import UntrustedWorkers
from procq._values import Completed, Failed, Failure, format_size
from procq._worker import worker_main

__all__ = ["Supervisor", "send_job"]

#: How long stopping workers get to exit on their own before they are killed.
STOP_GRACE = 3.0
#: How long to wait before trying again to start a worker that failed to start.
RESTART_BACKOFF = 1.0
#: How long a worker whose pipe reached EOF may live on before it is killed.
EOF_GRACE = 1.0
#: Backoff before starting again after a worker died while starting: doubles
#: with each one in a row, up to the maximum.
BOOT_BACKOFF = 0.05
BOOT_BACKOFF_MAX = 5.0
#: After this many workers in a row died while starting, a lane's waiting jobs fail.
BOOT_FAILURES_TO_FAIL_JOBS = 3
#: How often the memory of running jobs with a memory limit is sampled.
MEMORY_CHECK_INTERVAL = 0.05
#: A trusted worker's messages have no size limit but the format's.
TRUSTED_LIMIT = 1 << 62























class Supervisor(UntrustedWorkers):
    """Starts, watches and reaps one queue's workers on a thread of its own."""

    def __init__(self, core: Core, context: Any, name: str) -> None:
        self.core = core
        self.context = context
        self.name = name
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._wake_lock = threading.Lock()
        self._wake_closed = False
        # Untrusted workers watch the read end: it reaches EOF when this
        # process dies, since only this process holds the write end.
        self._alive_r, self._alive_w = os.pipe()
        # What the I/O thread waits on: each worker's pipe and sentinel (a
        # pidfd), and the wake-up pipe, registered once in a selector that
        # lives as long as the thread (not rebuilt on every wait).
        self._by_object: dict[Any, WorkerSlot] = {}
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._wake_r)
        self._retry_at: dict[str, list[float]] = {}  # lane name -> start retry times
        self._kill_at: dict[WorkerSlot, float] = {}  # workers at EOF or retired, killed if still alive then
        # SIGKILLs due after a SIGTERM's grace: (when, worker, its descendants then).
        self._kills: list[tuple[float, WorkerSlot, list[Any]]] = []
        self._next_sample = 0.0  # next memory sample, while memory-limited jobs run
        # Workers whose running job q.cancel() ended, to be killed by the I/O thread.
        self._pending_terminations: list[tuple[WorkerSlot, Entry]] = []
        # Untrusted workers: the answer a job's process sent, kept until the
        # worker reports that process's exit (see _on_untrusted).
        self._answers: dict[WorkerSlot, Completed[Any] | Failed] = {}
        self._stop = False
        self._cancel = False
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=f"procq-supervisor-{name}", daemon=True)
        core.on_new_deadline = self.wake

    # --- control, from any thread ---------------------------------------------

    def start(self) -> None:
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            self._thread.join()
            raise self._start_error

    def wake(self) -> None:
        # Under a lock so that the pipe is never closed (and its descriptor
        # reused by someone else's file) between the check and the write.
        with self._wake_lock:
            if self._wake_closed:
                return
            try:
                os.write(self._wake_w, b"\0")
            except BlockingIOError:
                pass  # the pipe is full: a wake-up is pending anyway

    def cancel_all(self) -> None:
        """Cancel waiting jobs and kill running ones (close without waiting)."""
        self._cancel = True
        self.wake()

    def cancel(self, key: str) -> bool:
        """``q.cancel(key)``: the core decides; a running job's tree is killed
        by the I/O thread, and a worker that holds the job unstarted is told
        to skip it, from here, before ``cancel`` returns."""
        cancelled, kill, skip = self.core.cancel(key)
        if kill is not None:
            self._pending_terminations.append(kill)
            self.wake()
        if skip is not None:
            send_skip(self.core, *skip)
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
                    self._start_worker(lane, reserved=False, raise_errors=True)
        except BaseException as exc:
            self._start_error = exc
            self._shutdown()
            self._started.set()
            return
        self._started.set()
        try:
            self._loop()
        except BaseException:  # pragma: no cover - a bug here must not hang waiters
            traceback.print_exc()
            self.core.start_closing()
            self._kill_all(self.core.cancel_all("was cancelled: procq's supervisor thread failed"))
        finally:
            self._shutdown()

    def _loop(self) -> None:
        core = self.core
        while not self._stop:
            if self._cancel:
                self._cancel = False
                self._kill_all(core.cancel_all("was cancelled: the queue was closed without waiting"))
            while self._pending_terminations:  # from q.cancel(), on other threads
                self._cancel_running(*self._pending_terminations.pop())
            timeout = self._timeout()
            for key, _ in self._selector.select(timeout):
                obj = key.data
                if obj is self._wake_r:
                    self._drain_wakeups()
                    continue
                worker = self._by_object.get(obj)
                if worker is None or worker.life is WorkerLife.DEAD:
                    continue  # handled earlier in this batch
                if obj is worker.conn:
                    self._read(worker)
                else:
                    self._on_death(worker)
            now = time.monotonic()
            for worker in core.expired(now):
                self._terminate(worker)
            for worker, entry in core.due(now):
                send_job(core, worker, entry)
            if core.memory_jobs and now >= self._next_sample:
                self._check_memory()
                self._next_sample = time.monotonic() + MEMORY_CHECK_INTERVAL
            for worker, when in list(self._kill_at.items()):
                if when <= now:
                    del self._kill_at[worker]
                    self._eof_overdue(worker)
            if self._kills and self._kills[0][0] <= now:
                due = [k for k in self._kills if k[0] <= now]
                self._kills = [k for k in self._kills if k[0] > now]
                for _, worker, descendants in due:
                    self._kill_tree(worker, descendants)
            self._retry_starts(now)

    def _cancel_running(self, worker: WorkerSlot, entry: Entry) -> None:
        """Kill the worker of a job ``q.cancel`` ended while it ran, unless
        the job ended first and the worker has moved on (``Core.spare``)."""
        kill, batch = self.core.spare(worker, entry) if worker.conn in self._by_object else (True, [])
        if kill:
            self._terminate(worker)
        elif batch:
            send_jobs(self.core, worker, batch)

    def _timeout(self) -> float | None:
        times = [t for ts in self._retry_at.values() for t in ts]
        times.extend(self._kill_at.values())
        if self._kills:
            times.append(self._kills[0][0])
        if self.core.memory_jobs:
            times.append(self._next_sample)
        deadline = self.core.next_deadline()
        if deadline is not None:
            times.append(deadline)
        when = min(times, default=None)
        if when is None:
            return None
        return max(0.0, when - time.monotonic())

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    # --- workers -------------------------------------------------------------

    def _start_worker(self, lane: LaneState, reserved: bool, raise_errors: bool = False) -> None:
        """Start a worker for ``lane``; ``reserved``: a replacement counted by
        ``Core.reserve_restart`` (or ``worker_died``)."""
        try:
            if lane.spec.trusted:
                worker = self._start_trusted(lane)
            else:
                worker = self._start_untrusted(lane)
        except Exception:
            if raise_errors:
                raise
            # Out of processes or memory, most likely: the lane runs short
            # until a later attempt succeeds.
            traceback.print_exc()
            self.core.add_worker(None, lane, reserved)
            self._retry_at.setdefault(lane.name, []).append(time.monotonic() + RESTART_BACKOFF)
            return
        if worker.reader is None:
            worker.inbox = FrameReader(worker.conn.fileno(), TRUSTED_LIMIT, wait_whole=True)
        self._watch(worker.conn, worker)
        self._watch(worker.sentinel, worker)
        self.core.add_worker(worker, lane, reserved)

    def _start_trusted(self, lane: LaneState) -> WorkerSlot:
        parent_conn, child_conn = self.context.Pipe(duplex=True)
        try:
            process = self.context.Process(
                target=worker_main,
                args=(child_conn, lane.name, worker_config(lane.spec)),
                name=f"procq-worker-{self.name}-{lane.name}",
                daemon=False,
            )
            process.start()
        except BaseException:
            parent_conn.close()
            raise
        finally:
            child_conn.close()  # the child has its own copy now
        return WorkerSlot(lane, process, parent_conn, sentinel=pidfd(process.pid))


    def _retry_starts(self, now: float) -> None:
        if self._stop or self.core.cancelled:
            return
        for name, times in self._retry_at.items():
            due = [t for t in times if t <= now]
            if due:
                self._retry_at[name] = [t for t in times if t > now]
                for _ in due:
                    lane = self.core.lanes[name]
                    self.core.reserve_restart(lane)
                    self._start_worker(lane, reserved=True)

    def _watch(self, obj: Any, worker: WorkerSlot) -> None:
        self._by_object[obj] = worker
        self._selector.register(obj, selectors.EVENT_READ, obj)

    def _unwatch(self, obj: Any) -> None:
        """Stop waiting on ``obj`` (before it is closed: a closed descriptor
        cannot be taken out of an epoll set)."""
        if self._by_object.pop(obj, None) is not None:
            self._selector.unregister(obj)

    def _read(self, worker: WorkerSlot) -> bool:
        """Read and act on what the worker sent. False once nothing more can
        be read from it (EOF, or it broke the protocol)."""
        if worker.reader is not None:
            return self._read_untrusted(worker)
        try:
            frames = worker.inbox.read()
        except EOFError:
            self._on_eof(worker)
            return False
        # Every message that has arrived, then the jobs they freed room for,
        # to the same worker in one frame.
        # Waiters are woken after that, once for them all: a thread waiting on
        # many handles wakes once per read, not once per job.
        wakeups: list[Callable[[], None]] = []
        reports = []
        for frame in frames:
            message = decode_trusted(frame, worker)
            if len(message) == 1:  # READY: before any job, so no report waits
                batch = self._on_message(worker, message, wakeups)
                if batch:
                    send_jobs(self.core, worker, batch)
            else:
                reports.append(report(worker, message))
        if reports:
            if over_rss(worker):
                job_id, outcome, _, crashed = reports[-1]
                reports[-1] = (job_id, outcome, True, crashed)
            batch, status, taken = self.core.jobs_done(worker, reports, wakeups)
            if status == "retire":
                self._retire(worker)
            elif status == "unexpected":
                job_id = reports[taken][0]
                held = worker.entry
                what = "while it held no job" if held is None else f"while it held job {held.key!r}"
                self._violation(worker, f"a message about job id {job_id} {what}")
            if batch:
                send_jobs(self.core, worker, batch)
        run_wakeups(wakeups)
        return bool(frames)




    def _drain(self, worker: WorkerSlot) -> None:
        """Act on whatever a dead worker wrote before it died."""
        conn = worker.conn
        try:
            if worker.reader is not None:
                while conn in self._by_object and self._read_untrusted(worker):
                    pass
            else:
                while conn in self._by_object and self._read(worker):
                    pass
        except (EOFError, OSError):
            pass

    def _on_eof(self, worker: WorkerSlot) -> None:
        """The worker's end of the pipe closed. Usually it is dying and its
        sentinel follows at once (under forkserver, once the server has reaped
        it); a worker that closed its pipe and lives on is killed after a grace.
        Either way its death is handled by ``_on_death`` when the sentinel fires."""
        self.core.doom(worker)
        self._unwatch(worker.conn)
        self._kill_at[worker] = time.monotonic() + EOF_GRACE

    def _eof_overdue(self, worker: WorkerSlot) -> None:
        """A worker lives on after its pipe closed (or after it was retired):
        kill it. Holding a job, it broke the protocol: a worker only closes
        its pipe by exiting."""
        entry = worker.entry
        if entry is not None and worker.life is not WorkerLife.RETIRED:
            what = f"closing its pipe and running on ({EOF_GRACE:g}s later it was still alive, and was killed)"
            self.core.decide_kill(worker, entry, protocol_failure(worker, entry, what))
        self._kill_tree(worker)

    def _on_message(
        self, worker: WorkerSlot, message: tuple[Any, ...], wakeups: list[Callable[[], None]] | None = None
    ) -> list[Entry]:
        """Act on one decoded message: READY, or the end of the worker's job.
        Returns the jobs to send the worker next; the caller sends them, in
        one frame with any others for it (it holds one right to send). Given
        ``wakeups``, the ended job's wake-ups go there for the caller to run."""
        if len(message) == 1:  # READY
            if not worker.life.booting:
                self._violation(worker, "a second READY message")
                return []
            ready = self.core.worker_ready(worker)
            return [] if ready is None else [ready]
        job_id = message[0]
        held = worker.entry
        if held is None or held.job_id != job_id:
            what = "while it held no job" if held is None else f"while it held job {held.key!r}"
            self._violation(worker, f"a message about job id {job_id} {what}")
            return []
        _, outcome, retire, _ = report(worker, message)
        if over_rss(worker):
            retire = True
        batch, status = self.core.job_done(worker, job_id, outcome, retire, wakeups)
        if status == "retire":
            self._retire(worker)
        return batch

    def _violation(self, worker: WorkerSlot, what: str) -> None:
        """The worker broke the protocol: fail its job (if it holds one) with
        kind "protocol", kill it, and let ``_on_death`` replace it."""
        entry = worker.entry
        if entry is not None:
            self.core.decide_kill(worker, entry, protocol_failure(worker, entry, what))
        self.core.doom(worker)
        self._unwatch(worker.conn)
        self._kill_tree(worker)

    def _retire(self, worker: WorkerSlot) -> None:
        """Replace a worker between jobs: close its pipe (it exits on EOF), and
        start its replacement at once."""
        self._unwatch(worker.conn)
        with self.core.lock:
            close_now = worker.sending == 0
        if close_now:
            close_worker_pipe(worker)
        self._kill_at[worker] = time.monotonic() + STOP_GRACE
        self._start_worker(worker.lane, reserved=True)

    def _check_memory(self) -> None:
        """Kill running jobs whose process tree went over their memory limit."""
        watched = self.core.memory_limited()
        if not watched:
            return
        children = children_map()
        for worker, entry in watched:
            limit = entry.memory_limit
            assert limit is not None and worker.pid is not None
            base = entry.rss_base
            if worker.reader is not None:
                # An untrusted lane's job runs in a copy of its worker, which
                # starts with (roughly) the worker's resident pages as its own.
                base *= 2
            used = tree_rss(worker.pid, children) - base
            if used <= limit:
                continue
            failure = Failure(
                "memory",
                f"job {entry.key!r} went over its memory_limit of {format_size(limit)} (its process tree "
                f"held {format_size(used)} more than the idle worker); its worker (pid {worker.pid}) and "
                "that process's tree were killed",
                pid=worker.pid,
            )
            if self.core.decide_kill(worker, entry, failure):
                self._kill_tree(worker)

    def _on_death(self, worker: WorkerSlot) -> None:
        """Handle a worker that died, or whose pipe reached EOF."""
        self.core.doom(worker)  # from now on it gets no job
        conn, process = worker.conn, worker.process
        # Whatever it left behind in its process group goes with it.
        signal_group(worker.pid, signal.SIGKILL)
        # A result written just before the death still counts.
        self._drain(worker)
        self._kill_at.pop(worker, None)  # (after the drain, which may see EOF and set it)
        self._answers.pop(worker, None)  # a job's answer counts only once its process has exited
        process.join()  # the sentinel fired: this reaps it at once
        exitcode = process.exitcode
        sig, how, cause = describe_exit(exitcode)
        explained = "" if not cause else f": {cause}" if sig else f" ({cause})"

        def crash(entry: Entry) -> Failure:
            kind = "timeout" if sig == "SIGXCPU" else "crashed"
            return Failure(
                kind,
                f"worker process {worker.pid} (lane {worker.lane.name!r}) {how}{explained}, "
                f"while running job {entry.key!r}",
                exitcode=exitcode,
                signal=sig,
                pid=worker.pid,
            )

        lane = worker.lane
        stopping = self._stop or self.core.cancelled or self.core.closing and self.core.drained.is_set()
        # (boot_failures is only ever changed on this thread.)
        retired = worker.life is WorkerLife.RETIRED
        replace_now = not stopping and not worker.life.booting and not lane.boot_failures and not retired
        close_now, wakeups = self.core.worker_died(worker, crash, exitcode, sig, restart=replace_now)
        self._unwatch(conn)
        self._unwatch(worker.sentinel)
        if close_now:
            close_worker_pipe(worker)
        close_sentinel(worker)
        process.close()
        # Waiters first: starting a process takes milliseconds, and the lane
        # already counts the replacement as alive.
        run_wakeups(wakeups)
        for idle, entry in self.core.handoffs():  # the dead worker's queued jobs
            send_job(self.core, idle, entry)
        if replace_now:
            self._start_worker(lane, reserved=True)
        elif not stopping and not retired:
            # Dying while starting is no job's fault, and starting again at
            # once would spin: back off, and after a few in a row fail the
            # jobs waiting for this lane rather than let them wait forever.
            failures = lane.boot_failures
            delay = min(BOOT_BACKOFF * 2 ** (failures - 1), BOOT_BACKOFF_MAX)
            self._retry_at.setdefault(lane.name, []).append(time.monotonic() + delay)
            if failures >= BOOT_FAILURES_TO_FAIL_JOBS:
                self.core.fail_waiting(lane, _cannot_start(lane, failures, how))

    def _terminate(self, worker: WorkerSlot) -> None:
        """End a worker's process tree: SIGTERM now (the job may clean up),
        SIGKILL to whatever is left after its lane's ``kill_grace``."""
        grace = worker.lane.spec.kill_grace
        if worker.life is WorkerLife.DEAD:
            return
        if grace <= 0 or worker.pid is None:
            self._kill_tree(worker)
            return
        descendants = find_descendants(worker.pid)
        signal_group(worker.pid, signal.SIGTERM)
        signal_worker(worker, signal.SIGTERM)
        for child in descendants:
            try:
                child.terminate()
            except Exception:
                pass
        self._kills.append((time.monotonic() + grace, worker, descendants))
        self._kills.sort(key=lambda k: k[0])

    def _kill_tree(self, worker: WorkerSlot, descendants: list[Any] | None = None) -> None:
        """SIGKILL a worker and every process below it (and ``descendants``,
        found earlier, which may have left its tree since)."""
        pid = worker.pid
        if pid is None:  # pragma: no cover
            return
        found: list[Any] = []
        if worker.life is not WorkerLife.DEAD:  # once reaped, its pid (and group id) may be someone else's
            found = find_descendants(pid)
            # The worker leads its own session (see _worker), so its group is its tree;
            # before it has called setsid() there is no such group and this fails harmlessly.
            signal_group(pid, signal.SIGKILL)
            signal_worker(worker, signal.SIGKILL)
        for child in [*found, *(descendants or ())]:
            try:
                child.kill()
            except Exception:
                pass

    def _kill_all(self, workers: list[WorkerSlot]) -> None:
        for worker in workers:
            self._kill_tree(worker)

    def _shutdown(self) -> None:
        """Stop every worker: EOF first, SIGKILL after a grace; reap them all."""
        self.core.stop()
        if self.core.live_count():  # only if the loop failed: nothing may hang
            self._kill_all(self.core.cancel_all("was cancelled: the queue's supervisor stopped"))
        for _, worker, descendants in self._kills:  # a grace cut short: nothing outlives the queue
            self._kill_tree(worker, descendants)
        self._kills = []
        workers = [w for w in set(self._by_object.values()) if w.life is not WorkerLife.DEAD]
        with self.core.lock:
            for w in workers:
                w.doom()
            closable = [w for w in workers if w.sending == 0]
        for w in closable:
            close_worker_pipe(w)
        deadline = time.monotonic() + STOP_GRACE
        alive: dict[Any, WorkerSlot] = {w.sentinel: w for w in workers}
        while alive:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for sentinel in wait(list(alive), remaining):
                del alive[sentinel]
        for w in alive.values():
            self._kill_tree(w)
        for w in workers:
            signal_group(w.pid, signal.SIGKILL)  # jobs' leftovers
            w.process.join()
            # A worker still holding a job here means the loop itself failed:
            # the job must still end, so no handle hangs.
            run_wakeups(self.core.worker_died(w, _stopped)[1])
            close_sentinel(w)
            w.process.close()
        self.core.handoffs()  # (nothing is sent any more)
        self._by_object.clear()
        self._selector.close()
        os.close(self._alive_r)
        os.close(self._alive_w)
        with self._wake_lock:
            self._wake_closed = True
            os.close(self._wake_r)
            os.close(self._wake_w)


























def _cannot_start(lane: LaneState, failures: int, how: str) -> Callable[[Entry], Failure]:
    def failure(entry: Entry) -> Failure:
        return Failure(
            "crashed",
            f"job {entry.key!r} could not run: the workers of lane {lane.name!r} keep dying while "
            f"they start ({failures} in a row; the last {how}). Their stderr says why; often the "
            "main module fails when a worker imports it (guard it with if __name__ == '__main__')",
        )

    return failure


def _stopped(entry: Entry) -> Failure:
    return Failure("cancelled", f"job {entry.key!r} was cancelled: the queue's supervisor stopped")
