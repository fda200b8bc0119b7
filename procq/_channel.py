"""How the supervisor reaches a worker: the ``WorkerChannel`` interface, and
``ProcessChannel``, what the two kinds of local worker share.

A channel is one worker as the I/O side sees it: it starts the worker, sends
it jobs and skips, turns what it sends back into events (``_protocol.Event``),
kills it and closes it. Its ``WorkerSlot`` (``_entries``) is the core's view of
the same worker (which jobs it holds, whether it is alive) and keeps the
channel in ``WorkerSlot.channel``; the core never calls it.

Kinds: ``TrustedChannel`` (``_channel_trusted``: a ``multiprocessing`` child,
pickled answers read in bulk), ``UntrustedChannel`` (``_channel_untrusted``:
a fresh ``python -I`` that forks a process per job, JSON answers checked one
by one) and ``DaskChannel`` (``_channel_dask``: one slot of a ``DaskLane``,
whose jobs run as tasks on a Dask cluster). A new kind of worker is a new
subclass of ``WorkerChannel``, chosen by ``channel_kind``.

Sending follows the core's rule of rights to send (``WorkerSlot.sending``, see
``_supervisor``): the caller of a ``send_*`` method holds rights, and the
method gives them all back (``Core.sent``), closing the channel itself when it
was the last sender of a worker that died or was retired meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from procq._processes import ExecProcess, find_descendants, process_pss, process_rss, signal_group, tree_memory
from procq._protocol import CANCEL, RUN, RUN_MANY, Event, FnMirror, FrameReader

if TYPE_CHECKING:
    from procq._core import Core
    from procq._entries import Entry, LaneState, WorkerSlot

__all__ = ["Launch", "ProcessChannel", "WorkerChannel", "channel_kind", "mark_starter_thread", "on_starter_thread"]


@dataclass(frozen=True)
class Launch:
    """What every worker of a queue is started with."""

    context: Any  # the queue's multiprocessing context
    name: str  # the queue's name, in its workers' process names
    alive_fd: int  # reaches EOF when the supervisor's process dies
    # What a kind of channel keeps per lane for the queue's life (a Dask
    # lane's client), by lane name; see ``WorkerChannel.close_lane``.
    lanes: dict[str, Any] = field(default_factory=dict)


class WorkerChannel(ABC):
    """One worker, as the supervisor's I/O thread reaches it.

    ``send_*`` may be called from any thread holding rights to send; every
    other method only from the I/O thread.
    """

    #: The worker's process id, for failure messages (None: not a local process).
    pid: int | None
    #: What the selector watches for messages (an object with ``fileno()``).
    messages: Any
    #: What the selector watches for the worker's death.
    sentinel: Any
    #: May a caller waiting on the worker's job read its pipe (``wait_readable``, ``read``)?
    leadable = False
    #: Does ``start`` run on the queue's starter thread (``_supervisor_start``)?
    #: Else on the I/O thread, which owns everything a kind keeps per lane.
    starts_off_thread: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def start(cls, lane: LaneState, launch: Launch) -> WorkerChannel:
        """Start a worker for ``lane``; raises if it cannot be started. On
        the starter thread if ``starts_off_thread`` (then it touches nothing
        of the I/O thread's), else on the I/O thread."""

    @classmethod
    def close_lane(cls, lane: LaneState, launch: Launch) -> None:
        """The queue stopped and every worker of ``lane`` is reaped: close what
        the kind keeps for the lane (``Launch.lanes``). Nothing, by default."""
        return None

    @abstractmethod
    def send_job(self, core: Core, worker: WorkerSlot, entry: Entry) -> None:
        """Send one job; the caller holds one right to send."""

    @abstractmethod
    def send_jobs(self, core: Core, worker: WorkerSlot, entries: list[Entry], rights: int = 1) -> None:
        """Send jobs to run in order, in one frame; the caller holds ``rights`` rights."""

    @abstractmethod
    def send_skip(self, core: Core, worker: WorkerSlot, job_id: int) -> None:
        """Tell the worker to skip job ``job_id``, sent and not started; the caller holds one right."""

    @abstractmethod
    def read(self, worker: WorkerSlot) -> list[Event]:
        """The events that have arrived (without blocking on a partial message),
        up to and including the first violation. Raises ``EOFError`` once the
        worker's end is closed."""

    def wait_readable(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for ``read`` to have something (only if ``leadable``)."""
        raise NotImplementedError

    def resume(self, worker: WorkerSlot, decoded: Any) -> list[Event]:
        """What a ``DecodeLater`` this channel gave decoded to (on the I/O
        thread): the events that follow, as ``read`` gives them. Only a kind
        that gives ``DecodeLater`` events is ever called."""
        raise NotImplementedError

    @abstractmethod
    def rss(self) -> int:
        """The worker's resident memory in bytes (0 once it is gone)."""

    @abstractmethod
    def job_memory(self, entry: Entry, children: dict[int, list[int]]) -> int:
        """What the running ``entry`` holds beyond the idle worker, in bytes
        (``children``: every process's children, from ``children_map``)."""

    @abstractmethod
    def terminate(self) -> list[Any]:
        """Ask the worker and everything below it to end (SIGTERM); returns
        what ``kill`` must also reach after the grace (its descendants now)."""

    @abstractmethod
    def kill(self, descendants: list[Any] | None = None) -> None:
        """End the worker and everything below it now (SIGKILL), and ``descendants``."""

    @abstractmethod
    def kill_group(self) -> None:
        """SIGKILL what is left in the worker's process group (its jobs' leftovers)."""

    @abstractmethod
    def close(self) -> None:
        """Close the worker's end of the pipe (it exits when it sees that)."""

    @abstractmethod
    def reap(self) -> int | None:
        """Wait for the worker, whose death was seen; its exit code (negative: a signal)."""

    @abstractmethod
    def release(self) -> None:
        """Close what is left (the death sentinel) once it is reaped and unwatched."""


_starter = threading.local()


def mark_starter_thread() -> None:
    """Said by a queue's starter thread as it begins (``_supervisor_start``):
    what it starts is a replacement or a spare, never one of the queue's
    first workers, and a kind may start those otherwise (a trusted lane's
    template forks them: ``TrustedChannel.start``)."""
    _starter.on = True


def on_starter_thread() -> bool:
    return getattr(_starter, "on", False)


def channel_kind(lane: LaneState) -> type[WorkerChannel]:
    """The kind of worker ``lane`` runs: a new kind is one more class here.
    (Imported here, not at the top: each kind's module imports this one, and
    a Dask lane's needs procq's dask extra.)"""
    if lane.spec.remote:
        from procq._channel_dask import DaskChannel

        return DaskChannel
    from procq._channel_trusted import TrustedChannel
    from procq._channel_untrusted import UntrustedChannel

    return TrustedChannel if lane.spec.trusted else UntrustedChannel


class ProcessChannel(WorkerChannel):
    """A worker that is a local process, on a duplex pipe of its own: sending
    RUN frames, signalling its tree and reaping it are the same for both kinds."""

    #: A job frame larger than this is written from a thread of its own.
    inline_limit = 1 << 62
    #: Starting a local process touches nothing the I/O thread owns.
    starts_off_thread = True

    def __init__(self, process: Any, conn: Any, sentinel: Any, reader: FrameReader) -> None:
        self.process = process
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
            if entry.memory_limit is not None:
                entry.rss_base = process_pss(self.pid)  # measured as job_memory measures the tree
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
            fns = self.fns
            runs = []
            for entry in entries:  # (none has a memory limit: see Dispatch._top_up)
                fn_bytes: bytes | None = None if fns.touch(entry.fn_id) else entry.fn_bytes
                runs.append((entry.job_id, entry.fn_id, fn_bytes, entry.args_bytes, entry.memory_limit))
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

    def job_memory(self, entry: Entry, children: dict[int, list[int]]) -> int:
        # Proportional set sizes: pages shared after a fork count once. (An
        # untrusted job's process, a copy of its worker, adds only what it
        # changes or allocates: the pages it shares with the worker are split
        # between the two.)
        return tree_memory(self.pid, children, entry.rss_base, entry.memory_limit)

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
