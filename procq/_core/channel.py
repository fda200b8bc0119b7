"""How the supervisor reaches a worker: the ``WorkerChannel`` interface.

A channel is one worker as the I/O side sees it: it starts the worker, sends
it jobs and skips, turns what it sends back into events (``_wire.protocol.Event``),
kills it and closes it. Its ``WorkerSlot`` (``_core.entries``) is the core's view of
the same worker (which jobs it holds, whether it is alive) and keeps the
channel in ``WorkerSlot.channel``; the core never calls it.

Kinds: ``TrustedChannel`` (``_supervisor.channel_trusted``: a ``multiprocessing`` child,
pickled answers read in bulk), ``UntrustedChannel`` (``_supervisor.channel_untrusted``:
a fresh ``python -I`` that forks a process per job, JSON answers checked one
by one) and ``DaskChannel`` (``_cluster.channel``: one slot of a ``DaskLane``,
whose jobs run as tasks on a Dask cluster). A new kind of worker is a new
subclass of ``WorkerChannel``, registered in ``_supervisor.channels.KINDS``.

Sending follows the core's rule of rights to send (``WorkerSlot.sending``, see
``_supervisor.loop``): the caller of a ``send_*`` method holds rights, and the
method gives them all back (``Core.sent``), closing the channel itself when it
was the last sender of a worker that died or was retired meanwhile.

The interface sits beside the core, not with its implementations: a
``WorkerSlot`` keeps its worker's channel, and the supervisor's kinds are
chosen above it (``_supervisor.channels.channel_kind``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from procq._core.core import Core
    from procq._core.entries import Entry, LaneState, WorkerSlot
    from procq._wire.protocol import Event

__all__ = ["Launch", "WorkerChannel"]


@dataclass(frozen=True)
class Launch:
    """What every worker of a queue is started with."""

    context: Any  # the queue's multiprocessing context
    name: str  # the queue's name, in its workers' process names
    alive_fd: int  # reaches EOF when the supervisor's process dies
    # What a kind of channel keeps per lane for the queue's life (a Dask
    # lane's client), by lane name; see ``WorkerChannel.close_lane``.
    lanes: dict[str, Any] = field(default_factory=dict)
    # Asks the starter thread to run ``WorkerChannel.warm`` for a lane (any
    # thread; never waits): the queue's starter puts its ``warm`` here.
    warmers: list[Callable[[LaneState], None]] = field(default_factory=list)


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
    #: Does ``start`` run on the queue's starter thread (``_supervisor.start``)?
    #: Else on the I/O thread, which owns everything a kind keeps per lane.
    starts_off_thread: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def start(cls, lane: LaneState, launch: Launch) -> WorkerChannel:
        """Start a worker for ``lane``; raises if it cannot be started. On
        the starter thread if ``starts_off_thread`` (then it touches nothing
        of the I/O thread's), else on the I/O thread."""

    @classmethod
    def warm(cls, lane: LaneState, launch: Launch) -> None:
        """Ready what later starts of ``lane`` fork from (a trusted lane's
        template importing what its jobs needed: ``_worker.warm``). On the
        starter thread, asked through ``Launch.warmers``. Nothing, by default."""
        return None

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

    def last_started(self) -> int | None:
        """After the worker's death: the id of the last job it started (0:
        none), or None if this kind cannot tell (then the job it held counts
        as started). See ``_wire.startmark``."""
        return None

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
