"""procq's public values that say where a key is: failures, the four key states, stats.

All of them are frozen dataclasses: they are handed across threads and event
loops and never change once made. (What a job is, and the lanes and policies
it runs under, are in ``_model.job`` and ``_model.policies``; what a push answers, in
``_api.outcomes``, beside the handles it carries.)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Generic, Literal, TypeVar, get_args

__all__ = [
    "RETRYABLE_KINDS",
    "Completed",
    "Failed",
    "Failure",
    "FailureKind",
    "LaneStats",
    "Pending",
    "Processing",
    "QueueStats",
    "State",
]

T = TypeVar("T")

#: How a job failed: what each kind means is listed in :class:`Failure`.
FailureKind = Literal["error", "crashed", "timeout", "cancelled", "memory", "protocol", "interrupted"]

#: The failure kinds a ``Retry`` may retry: all but ``"cancelled"`` (a
#: cancelled job was stopped on purpose).
RETRYABLE_KINDS: frozenset[FailureKind] = frozenset(get_args(FailureKind)) - {"cancelled"}


# --- The four states of a key ------------------------------------------------


@dataclass(frozen=True)
class Pending:
    """Claimed; no worker has started it yet (waiting in its lane, for its
    ``not_before`` time, or for its retry backoff).

    ``attempt`` is the attempt that will run next: 1, or more while a job
    with a ``Retry`` waits to run again. ``Pending() == Pending(attempt=1)``.
    """

    attempt: int = 1


@dataclass(frozen=True)
class Processing:
    """A worker process is executing the job."""


@dataclass(frozen=True, init=False)
class Completed(Generic[T]):
    """The job returned ``output``. Pushing the key again answers ``Cached(output)``."""

    output: T

    def __init__(self, output: T) -> None:
        self.__dict__["output"] = output  # (made for every job that completes: kept cheap)


@dataclass(frozen=True)
class Failure:
    """How a job failed.

    ``pid`` is the worker process that ran (or held) the job. ``kind`` is one of:

    - ``"error"``: the job raised (any ``BaseException``, ``SystemExit``
      included), or its arguments, result or exception could not cross the
      process boundary; ``exc_type``, ``message`` and ``traceback`` say which.
    - ``"crashed"``: the worker process died while it held the job (a signal
      such as SIGSEGV or SIGKILL, ``os._exit``, ``abort``, the OOM killer);
      ``exitcode`` and ``signal`` say how.
    - ``"timeout"``: the job ran longer than its ``timeout`` (or used up its
      ``rlimits["cpu"]``) and its worker's process tree was killed.
    - ``"memory"``: the job went over its ``memory_limit``: it raised
      ``MemoryError`` (in any lane), or the supervisor saw its process tree's
      resident memory pass the limit and killed it.
    - ``"cancelled"``: ``q.cancel(key)`` removed the job or killed it, or it
      was abandoned before it ran: its push gave up waiting for room, was
      cancelled or interrupted, or the queue was closed without waiting.
    - ``"protocol"``: the worker broke procq's protocol: a message that was
      malformed, out of turn, about another job, not JSON in an untrusted
      lane, or a result larger than the lane's ``max_result_bytes``. The
      worker is replaced.
    - ``"interrupted"``: the queue that held the job (sharing a ``store``)
      died, and its lease ran out before the job ended.

    ``attempts`` is how many attempts ran (more than 1 only with a ``Retry``);
    ``history`` then holds each attempt's own failure, first to last, and the
    message lists them.
    """

    kind: FailureKind
    message: str
    exc_type: str | None = None
    traceback: str | None = None
    exitcode: int | None = None
    signal: str | None = None
    pid: int | None = None
    attempts: int = 1
    history: tuple[Failure, ...] = field(default=(), repr=False)
    #: The job's exception itself, where it could be unpickled in the supervisor.
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        text = f"{self.kind}: {self.message}"
        if self.kind == "error" and self.exc_type and not self.message.startswith(self.exc_type):
            text = f"{self.kind}: {self.exc_type}: {self.message}"
        return text


@dataclass(frozen=True)
class Failed:
    """The job failed; ``failure`` says how. Pushing the key again runs fresh work."""

    failure: Failure


State = Pending | Processing | Completed[Any] | Failed


# --- Stats --------------------------------------------------------------------


class _ItemAccess:
    """Lets stats be read as ``s.crashes`` or ``s["crashes"]``."""

    def __getitem__(self, name: str) -> Any:
        try:
            return getattr(self, name)
        except AttributeError:
            raise KeyError(name) from None


@dataclass(frozen=True)
class LaneStats(_ItemAccess):
    """One lane's counters at the moment ``stats()`` was called."""

    name: str
    workers: int  # the lane's limit
    capacity: int
    waiting: int  # queued for a worker, including pushes blocked for room
    running: int
    workers_alive: int
    crashes: int  # jobs whose worker died under them
    worker_restarts: int  # workers replaced (by a new process or a spare)
    completed: int
    failed: int
    retries: int = 0  # failed attempts that a Retry ran again
    spares: int = 0  # warm spare workers, booting or ready (see ``Lane.spare_workers``)
    # A sandboxed lane's parts and bounds and what enforces each here (see ``Sandbox``); None for other lanes.
    sandbox: dict[str, str] | None = None


@dataclass(frozen=True)
class QueueStats(_ItemAccess):
    """Counts of keys per state, and every lane's :class:`LaneStats`."""

    pending: int
    processing: int
    completed: int
    failed: int
    lanes: dict[str, LaneStats]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
