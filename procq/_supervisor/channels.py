"""How the supervisor picks and drives a worker of each kind: ``KINDS``, the
registry of channel classes (``channel_kind``), and ``ProcessChannel``, what
the two kinds of local worker share. The interface every kind implements,
``WorkerChannel``, is in ``_core.channel``.

Kinds: ``TrustedChannel`` (``_supervisor.channel_trusted``: a ``multiprocessing`` child,
pickled answers read in bulk), ``UntrustedChannel`` (``_supervisor.channel_untrusted``:
a fresh ``python -I`` that forks a process per job, JSON answers checked one
by one) and ``DaskChannel`` (``_cluster.channel``: one slot of a ``DaskLane``,
whose jobs run as tasks on a Dask cluster). A new kind of worker is a new
subclass of ``WorkerChannel``, registered in ``KINDS`` by its module.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import threading
from typing import TYPE_CHECKING, Any

from procq._core.channel import WorkerChannel
from procq._system.processes import ExecProcess, find_descendants, process_pss, process_rss, signal_group, tree_memory
from procq._wire.protocol import CANCEL, RUN, RUN_MANY, FnMirror, FrameReader
from procq._wire.startmark import StartMark

if TYPE_CHECKING:
    from procq._core.core import Core
    from procq._core.entries import Entry, LaneState, WorkerSlot

__all__ = ["KINDS", "ProcessChannel", "channel_kind", "mark_starter_thread", "on_starter_thread"]


#: The channel class of each kind of lane. Each kind's module registers its
#: class as it is imported, so that this base module never imports them: the
#: supervisor imports the two local kinds, and the queue the Dask one when a
#: lane is remote (it needs procq's dask extra).
KINDS: dict[str, type[WorkerChannel]] = {}


_starter = threading.local()


def mark_starter_thread() -> None:
    """Said by a queue's starter thread as it begins (``_supervisor.start``):
    what it starts is a replacement or a spare, never one of the queue's
    first workers, and a kind may start those otherwise (a trusted lane's
    template forks them: ``TrustedChannel.start``)."""
    _starter.on = True


def on_starter_thread() -> bool:
    return getattr(_starter, "on", False)


def channel_kind(lane: LaneState) -> type[WorkerChannel]:
    """The kind of worker ``lane`` runs: a new kind is one more class,
    registered in ``KINDS`` by its module."""
    spec = lane.spec
    return KINDS["remote" if spec.remote else "trusted" if spec.trusted else "untrusted"]


class ProcessChannel(WorkerChannel):
    """A worker that is a local process, on a duplex pipe of its own: sending
    RUN frames, signalling its tree and reaping it are the same for both kinds."""

    COUNTS_FROM_START = True  # (see _start_mark)

    #: A job frame larger than this is written from a thread of its own.
    inline_limit = 1 << 62
    #: Starting a local process touches nothing the I/O thread owns.
    starts_off_thread = True

    def __init__(
        self, process: Any, conn: Any, sentinel: Any, reader: FrameReader, mark: StartMark | None = None
    ) -> None:
        self.process = process
        # Where the worker says which job it starts (its own copy is made; this one is read at its death).
        self.mark = mark
        self.conn = conn
        self.messages = conn
        self.sentinel = sentinel
        self.pid: int = process.pid
        self._reader = reader  # reads conn without blocking
        # Held while a frame is written: a q.cancel() telling a busy worker to
        # skip a job may write at the same time as the I/O thread sends it more.
        self.write_lock = threading.Lock()
        # Mirror of the worker's function cache (see _protocol.FnMirror).
        self.fns = FnMirror()
        # Once reaped, its pid (and group id) may be someone else's.
        self._reaped = False

    # --- sending, from the thread holding the right to send --------------------

    def send_job(self, core: Core, worker: WorkerSlot, entry: Entry) -> None:
        try:
            fn_bytes: bytes | None = entry.fn_bytes
            if self.fns.touch(entry.fn_id):
                fn_bytes = None
            if entry.memory_limit is not None and self._start_mark() is None:
                entry.rss_base = self.memory_base()  # measured as job_memory measures the tree
            frame = pickle.dumps((RUN, entry.job_id, entry.fn_id, fn_bytes, entry.args_bytes, entry.memory_limit), -1)
            if len(frame) > self.inline_limit:
                thread = threading.Thread(target=self._send, args=(core, worker, frame), name="procq-send", daemon=True)
                thread.start()
                return  # that thread gives the right back
        except BaseException:
            if core.sent(worker):
                self.close()
            raise
        self._send(core, worker, frame)

    def send_jobs(self, core: Core, worker: WorkerSlot, entries: list[Entry], rights: int = 1) -> None:
        if len(entries) == 1 and rights == 1:
            self.send_job(core, worker, entries[0])
            return
        try:
            touch = self.fns.touch
            runs = []
            last = None
            for entry in entries:  # (none has a memory limit: see Dispatch._top_up)
                fn_id = entry.fn_id
                # A touch of the id touched last changes nothing in the LRU (it
                # is its newest already), and finds it held: skipped.
                fn_bytes: bytes | None = None if fn_id is last or touch(fn_id) else entry.fn_bytes
                last = fn_id
                runs.append((entry.job_id, fn_id, fn_bytes, entry.args_bytes, entry.memory_limit))
            frame = pickle.dumps((RUN_MANY, runs), -1)
        except BaseException:
            if core.sent(worker, rights):
                self.close()
            raise
        self._send(core, worker, frame, rights)

    def send_skip(self, core: Core, worker: WorkerSlot, job_id: int) -> None:
        self._send(core, worker, pickle.dumps((CANCEL, job_id), -1))

    def _send(self, core: Core, worker: WorkerSlot, frame: bytes, rights: int = 1) -> None:
        try:
            with self.write_lock:  # one frame at a time, whole
                self.conn.send_bytes(frame)
        except (OSError, ValueError):
            pass  # the worker died; its sentinel tells the I/O thread, which fails the job
        finally:
            if core.sent(worker, rights):
                self.close()

    # --- the process, from the I/O thread ----------------------------------------

    def rss(self) -> int:
        return process_rss(self.pid)

    def memory_base(self) -> int:
        """What the worker uses before a job, which ``job_memory`` does not count as the job's."""
        return process_pss(self.pid)

    def job_memory(self, entry: Entry, children: dict[int, list[int]]) -> int:
        # Proportional set sizes: pages shared after a fork count once. (An
        # untrusted job's process, a copy of its worker, adds only what it
        # changes or allocates: the pages it shares with the worker are split
        # between the two.)
        base = self._memory_from(entry)
        if base is None:
            return 0  # not started yet: nothing of it runs
        return tree_memory(self.pid, children, base, entry.memory_limit)

    def _memory_from(self, entry: Entry) -> int | None:
        """What of the tree is not ``entry``'s: what the worker said it held
        as the job started (``_wire.startmark``; None before), or else what
        it held as the job was sent."""
        mark = self._start_mark()
        return entry.rss_base if mark is None else mark.base(entry.job_id)

    def _start_mark(self) -> StartMark | None:
        """The start mark in which the worker says what it held as a job with
        a memory limit started: a trusted worker's (an untrusted job's
        process unmaps the page before its job runs); else None."""
        return self.mark if self.COUNTS_FROM_START else None

    def terminate(self) -> list[Any]:
        descendants = find_descendants(self.pid)
        signal_group(self.pid, signal.SIGTERM)
        self._signal(signal.SIGTERM)
        for child in descendants:
            with contextlib.suppress(Exception):
                child.terminate()
        return descendants

    def kill(self, descendants: list[Any] | None = None) -> None:
        found: list[Any] = []
        if not self._reaped:
            found = find_descendants(self.pid)
            # The worker leads its own session (see _worker), so its group is its tree;
            # before it has called setsid() there is no such group and this fails harmlessly.
            signal_group(self.pid, signal.SIGKILL)
            self._signal(signal.SIGKILL)
        for child in [*found, *(descendants or ())]:
            with contextlib.suppress(Exception):
                child.kill()

    def kill_group(self) -> None:
        if not self._reaped:
            signal_group(self.pid, signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        if self._reaped:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, sig)

    def last_started(self) -> int | None:
        return None if self.mark is None else self.mark.started()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()
        self._reader.close()

    def reap(self) -> int | None:
        self.process.join()  # the sentinel fired: this returns at once
        self._reaped = True
        exitcode: int | None = self.process.exitcode
        return exitcode

    def release(self) -> None:
        # A pidfd of our own is closed here; multiprocessing's sentinel by Process.close.
        sentinel, process = self.sentinel, self.process
        ours = isinstance(process, ExecProcess) or getattr(process, "sentinel_is_ours", False)
        if isinstance(sentinel, int) and (ours or sentinel != process.sentinel):
            with contextlib.suppress(OSError):
                os.close(sentinel)
        process.close()
        if self.mark is not None:
            self.mark.close()
