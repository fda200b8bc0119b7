"""The supervisor's I/O side: worker processes, their pipes, deaths and deadlines.

Who owns what, and what each pipe carries::

    caller threads / asyncio tasks             supervisor I/O thread (one per queue)
    ------------------------------             -------------------------------------
    push(): claim in Core ──────────┐          wait() on, all at once:
      serialize fn + args           │            - every worker's pipe     (results)
      Core.offer():                 │            - every worker's sentinel (deaths)
        idle worker? send the job   │            - the wake-up pipe        (close, new deadline)
        directly on its pipe ───────┼──┐         with the nearest job deadline or due time as timeout
        else wait in the lane       │  │       on READY:     Core.worker_ready -> send it a waiting job
    handle.result() / await ────────┘  │       on a result:  Core.job_done -> send the next job
      wait for the entry's event       │       on a death:   Core.worker_died -> start a replacement,
                                       │                     then wake the dead job's waiters
                                       │       (a failed attempt with a Retry left is not ended:
                                       │        Core re-times it for its backoff; no wake-up)
                                       │       on a deadline: kill the worker's process tree
                                       │       on a due time: Core.due -> the job enters its lane
                                       │                      (an idle worker? send it the job)
                                       v
                       worker process (one pipe each; nothing shared)
                         starts -> READY frame (takes jobs from now on)
                         RUN frame -> run fn -> OK / ERROR frame

The I/O thread starts and reaps every worker process, so a worker's parent (or,
under forkserver, the forkserver's parent) is the supervisor for as long as the
queue lives. The thread that sends a job on a worker's pipe is whichever one
assigned it: ``Core._assign`` gives exactly one thread the right to send
(``WorkerSlot.sending``) until that thread calls ``Core.sent``, and a pipe is
only closed when no thread holds that right, so a descriptor is never closed,
reused and written to by a late sender.

Why not a thread hop for every send: a push that finds an idle worker sending
itself saves a wake-up of this thread and a context switch per job, which is
most of a tiny job's latency. Why not poll: ``connection.wait`` wakes on
exactly the events above and sleeps otherwise.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time
import traceback
from multiprocessing.connection import wait
from typing import Any, Callable

from procq._core import Core, Entry, LaneState, WorkerSlot, run_wakeups
from procq._errors import _RemoteTraceback
from procq._protocol import ERROR, OK, READY, RUN
from procq._values import Completed, Failed, Failure
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

_SIGNAL_HINTS = {
    "SIGSEGV": "a segmentation fault: native code run by the job crashed",
    "SIGBUS": "a bus error: native code run by the job crashed",
    "SIGILL": "an illegal instruction: native code run by the job crashed",
    "SIGFPE": "an arithmetic fault in native code run by the job",
    "SIGABRT": "abort() was called: os.abort(), a failed C assertion, or a fatal runtime error",
    "SIGKILL": "killed with SIGKILL: by the kernel's OOM killer if memory ran out, or by another process",
    "SIGTERM": "terminated by another process",
}


def send_job(core: Core, worker: WorkerSlot, entry: Entry) -> None:
    """Send ``entry`` to ``worker``; the caller holds the right to send (see above)."""
    try:
        fn_bytes: bytes | None = entry.fn_bytes
        if worker.fns.touch(entry.fn_id):
            fn_bytes = None
        frame = pickle.dumps((RUN, entry.job_id, entry.fn_id, fn_bytes, entry.args_bytes), -1)
        worker.conn.send_bytes(frame)
    except (OSError, ValueError):
        pass  # the worker died; its sentinel tells the I/O thread, which fails the job
    finally:
        if core.sent(worker):
            _close(worker.conn)


def _close(conn: Any) -> None:
    try:
        conn.close()
    except OSError:  # pragma: no cover
        pass


def describe_exit(exitcode: int | None) -> tuple[str | None, str, str]:
    """(signal name, what happened, likely cause) for a dead worker's exit code."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return name, f"was killed by {name} (signal {-exitcode})", _SIGNAL_HINTS.get(name, "")
    if exitcode is None:
        return None, "vanished without an exit status", ""
    return None, f"exited with code {exitcode}", "os._exit(), or exit() in native code, ended it mid-job"


class Supervisor:
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
        self._by_object: dict[Any, WorkerSlot] = {}
        self._objects: list[Any] = []
        self._retry_at: dict[str, list[float]] = {}  # lane name -> start retry times
        self._kill_at: dict[WorkerSlot, float] = {}  # workers at EOF, killed if still alive then
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
            timeout = self._timeout()
            for obj in wait(self._objects, timeout):
                if obj == self._wake_r:
                    self._drain_wakeups()
                    continue
                worker = self._by_object.get(obj)
                if worker is None or worker.dead:
                    continue  # handled earlier in this batch
                if obj is worker.conn:
                    self._read(worker)
                else:
                    self._on_death(worker)
            now = time.monotonic()
            for worker in core.expired(now):
                self._kill_tree(worker)
            for worker, entry in core.due(now):
                send_job(core, worker, entry)
            for worker, when in list(self._kill_at.items()):
                if when <= now:
                    del self._kill_at[worker]
                    self._kill_tree(worker)
            self._retry_starts(now)

    def _timeout(self) -> float | None:
        times = [t for ts in self._retry_at.values() for t in ts]
        times.extend(self._kill_at.values())
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
            parent_conn, child_conn = self.context.Pipe(duplex=True)
            try:
                process = self.context.Process(
                    target=worker_main,
                    args=(child_conn, lane.name),
                    name=f"procq-worker-{self.name}-{lane.name}",
                    daemon=False,
                )
                process.start()
            except BaseException:
                parent_conn.close()
                raise
            finally:
                child_conn.close()  # the child has its own copy now
        except Exception:
            if raise_errors:
                raise
            # Out of processes or memory, most likely: the lane runs short
            # until a later attempt succeeds.
            traceback.print_exc()
            self.core.add_worker(None, lane, reserved)
            self._retry_at.setdefault(lane.name, []).append(time.monotonic() + RESTART_BACKOFF)
            return
        worker = WorkerSlot(lane, process, parent_conn)
        self._by_object[parent_conn] = worker
        self._by_object[process.sentinel] = worker
        self._refresh_objects()
        self.core.add_worker(worker, lane, reserved)

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

    def _refresh_objects(self) -> None:
        self._objects = [self._wake_r, *self._by_object]

    def _read(self, worker: WorkerSlot) -> None:
        try:
            frame = worker.conn.recv_bytes()
        except (EOFError, OSError):
            self._on_eof(worker)
            return
        self._on_frame(worker, frame)

    def _on_eof(self, worker: WorkerSlot) -> None:
        """The worker's end of the pipe closed. Usually it is dying and its
        sentinel follows at once (under forkserver, once the server has reaped
        it); a worker that closed its pipe and lives on is killed after a grace.
        Either way its death is handled by ``_on_death`` when the sentinel fires."""
        self.core.doom(worker)
        self._by_object.pop(worker.conn, None)
        self._refresh_objects()
        self._kill_at[worker] = time.monotonic() + EOF_GRACE

    def _on_frame(self, worker: WorkerSlot, frame: bytes) -> None:
        message = pickle.loads(frame)
        job_id, tag = message[0], message[1]
        outcome: Completed[Any] | Failed
        if tag == READY:
            ready = self.core.worker_ready(worker)
            if ready is not None:
                send_job(self.core, worker, ready)
            return
        if tag == OK:
            try:
                outcome = Completed(pickle.loads(message[2]))
            except Exception as exc:
                outcome = Failed(
                    Failure(
                        "error",
                        f"the job's result could not be unpickled in the supervisor: {exc!r}",
                        exc_type=type(exc).__qualname__,
                        pid=worker.pid,
                    )
                )
        else:
            assert tag == ERROR
            exc_bytes, exc_type, text, tb = message[2:6]
            exception = None
            if exc_bytes is not None:
                try:
                    exception = pickle.loads(exc_bytes)
                    exception.__cause__ = _RemoteTraceback(tb)
                except Exception as exc:
                    text = f"{text} (the exception could not be unpickled in the supervisor: {exc!r})"
                    exception = None
            outcome = Failed(Failure("error", text, exc_type, tb, pid=worker.pid, exception=exception))
        nxt, ok = self.core.job_done(worker, job_id, outcome)
        if not ok:  # pragma: no cover - a trusted worker only reports its own job
            self.core.doom(worker)
            self._kill_tree(worker)
        elif nxt is not None:
            send_job(self.core, worker, nxt)

    def _on_death(self, worker: WorkerSlot) -> None:
        """Handle a worker that died, or whose pipe reached EOF."""
        self.core.doom(worker)  # from now on it gets no job
        conn, process = worker.conn, worker.process
        self._kill_at.pop(worker, None)
        # A result written just before the death still counts.
        try:
            while conn.poll(0):
                self._on_frame(worker, conn.recv_bytes())
        except (EOFError, OSError):
            pass
        process.join()  # the sentinel fired: this reaps it at once
        exitcode = process.exitcode
        sig, how, cause = describe_exit(exitcode)
        explained = "" if not cause else f": {cause}" if sig else f" ({cause})"

        def crash(entry: Entry) -> Failure:
            return Failure(
                "crashed",
                f"worker process {worker.pid} (lane {worker.lane.name!r}) {how}{explained}, "
                f"while running job {entry.key!r}",
                exitcode=exitcode,
                signal=sig,
                pid=worker.pid,
            )

        lane = worker.lane
        stopping = self._stop or self.core.cancelled or self.core.closing and self.core.drained.is_set()
        # (boot_failures is only ever changed on this thread.)
        replace_now = not stopping and not worker.booting and not lane.boot_failures
        close_now, wakeups = self.core.worker_died(worker, crash, exitcode, sig, restart=replace_now)
        self._by_object.pop(conn, None)
        del self._by_object[process.sentinel]
        self._refresh_objects()
        if close_now:
            _close(conn)
        process.close()
        # Waiters first: starting a process takes milliseconds, and the lane
        # already counts the replacement as alive.
        run_wakeups(wakeups)
        if replace_now:
            self._start_worker(lane, reserved=True)
        elif not stopping:
            # Dying while starting is no job's fault, and starting again at
            # once would spin: back off, and after a few in a row fail the
            # jobs waiting for this lane rather than let them wait forever.
            failures = lane.boot_failures
            delay = min(BOOT_BACKOFF * 2 ** (failures - 1), BOOT_BACKOFF_MAX)
            self._retry_at.setdefault(lane.name, []).append(time.monotonic() + delay)
            if failures >= BOOT_FAILURES_TO_FAIL_JOBS:
                self.core.fail_waiting(lane, _cannot_start(lane, failures, how))

    def _kill_tree(self, worker: WorkerSlot) -> None:
        """SIGKILL a worker and every process below it."""
        pid = worker.pid
        if pid is None:  # pragma: no cover
            return
        descendants: list[Any] = []
        try:
            import psutil

            descendants = psutil.Process(pid).children(recursive=True)
        except Exception:
            pass
        try:
            # The worker leads its own session (see _worker), so its group is its tree;
            # before it has called setsid() there is no such group and this fails harmlessly.
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for child in descendants:
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
        workers = [w for w in set(self._by_object.values()) if not w.dead]
        with self.core.lock:
            for w in workers:
                w.doomed = True
            closable = [w for w in workers if w.sending == 0]
        for w in closable:
            _close(w.conn)
        deadline = time.monotonic() + STOP_GRACE
        alive = {w.process.sentinel: w for w in workers}
        while alive:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for sentinel in wait(list(alive), remaining):
                del alive[sentinel]
        for w in alive.values():
            self._kill_tree(w)
        for w in workers:
            w.process.join()
            # A worker still holding a job here means the loop itself failed:
            # the job must still end, so no handle hangs.
            run_wakeups(self.core.worker_died(w, _stopped)[1])
            w.process.close()
        self._by_object.clear()
        self._objects = []
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
