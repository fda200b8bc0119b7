"""procq's public values: jobs, lanes, the four key states, push outcomes, failures, stats.

All of them are frozen dataclasses: they are handed across threads and event
loops and never change once made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generic, Mapping, TypeVar, Union

if TYPE_CHECKING:
    from procq._handle import JobHandle

__all__ = [
    "Cached",
    "Completed",
    "DEFAULT_CAPACITY",
    "Failed",
    "Failure",
    "InFlight",
    "Job",
    "Lane",
    "LaneStats",
    "Pending",
    "Processing",
    "PushOutcome",
    "QueueStats",
    "Queued",
    "State",
]

T = TypeVar("T")

#: How many waiting jobs a lane holds when its capacity is not given.
DEFAULT_CAPACITY = 1024


def _check_timeout(what: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds or None, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, got {value!r}")
    return float(value)


def check_wait(value: float | None) -> float | None:
    """Validate a ``timeout`` for a wait: None (no limit) or seconds >= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"timeout must be a number of seconds or None, got {type(value).__name__}: {value!r}")
    if math.isnan(value) or value < 0:
        raise ValueError(f"timeout must be None or a number of seconds >= 0, got {value!r}")
    return None if math.isinf(value) else float(value)


@dataclass(frozen=True, init=False)
class Job(Generic[T]):
    """One unit of work: a key, a function and its arguments.

    ``fn`` runs in a worker process, never in the supervisor. It may be a
    lambda, a closure or a local function: procq pickles it with cloudpickle.
    ``lane`` names the lane to run in (``None``: the queue's first lane).
    ``timeout`` is how many seconds the job may run once a worker has started
    it; past that its worker's process tree is killed and the job fails with
    kind ``"timeout"``.
    """

    key: str
    fn: Callable[..., T]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] | None = None
    lane: str | None = None
    timeout: float | None = None

    def __init__(
        self,
        key: str,
        fn: Callable[..., T],
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        lane: str | None = None,
        timeout: float | None = None,
    ) -> None:
        if not isinstance(key, str):
            raise TypeError(f"job key must be a str, got {type(key).__name__}: {key!r}")
        if not key:
            raise ValueError("job key must be a non-empty str")
        if type(key) is not str:
            # A str subclass could run its own __hash__ / __eq__ under the
            # state map's lock; keys are plain strings from here on.
            key = str.__str__(key)
        if not callable(fn):
            raise TypeError(f"job {key!r}: fn must be callable, got {type(fn).__name__}: {fn!r}")
        if isinstance(args, (str, bytes)) or not isinstance(args, (tuple, list)):
            raise TypeError(
                f"job {key!r}: args must be a tuple or list, got {type(args).__name__}"
            )
        if kwargs is not None:
            if not isinstance(kwargs, Mapping):
                raise TypeError(
                    f"job {key!r}: kwargs must be a mapping or None, got {type(kwargs).__name__}"
                )
            bad = [k for k in kwargs if not isinstance(k, str)]
            if bad:
                raise TypeError(f"job {key!r}: kwargs keys must be str, got {bad[0]!r}")
            kwargs = dict(kwargs)
        if lane is not None and not isinstance(lane, str):
            raise TypeError(f"job {key!r}: lane must be a str or None, got {type(lane).__name__}")
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "fn", fn)
        object.__setattr__(self, "args", tuple(args))
        object.__setattr__(self, "kwargs", kwargs)
        object.__setattr__(self, "lane", lane)
        object.__setattr__(self, "timeout", _check_timeout(f"job {key!r}: timeout", timeout))


@dataclass(frozen=True)
class Lane:
    """A lane's limits: at most ``workers`` jobs run at once, in that many
    worker processes, and at most ``capacity`` jobs wait for one of them.

    A push that finds ``capacity`` jobs already waiting blocks until one
    starts (or until the push's own timeout: ``LaneFull``).
    """

    workers: int = 1
    capacity: int = DEFAULT_CAPACITY

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int):
            raise TypeError(f"lane workers must be an int, got {type(self.workers).__name__}")
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int):
            raise TypeError(f"lane capacity must be an int, got {type(self.capacity).__name__}")
        if self.workers < 1:
            raise ValueError(f"a lane needs at least 1 worker, got {self.workers}")
        if self.capacity < 0:
            raise ValueError(f"a lane's capacity must be 0 or more, got {self.capacity}")


# --- The four states of a key ------------------------------------------------


@dataclass(frozen=True)
class Pending:
    """Claimed and queued in its lane; no worker has started it yet."""


@dataclass(frozen=True)
class Processing:
    """A worker process is executing the job."""


@dataclass(frozen=True)
class Completed(Generic[T]):
    """The job returned ``output``. Pushing the key again answers ``Cached(output)``."""

    output: T


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
    - ``"timeout"``: the job ran longer than its ``timeout`` and its worker's
      process tree was killed.
    - ``"cancelled"``: the job was abandoned before it ran: its push gave up
      waiting for room, was cancelled or interrupted, or the queue was closed
      without waiting.
    """

    kind: str
    message: str
    exc_type: str | None = None
    traceback: str | None = None
    exitcode: int | None = None
    signal: str | None = None
    pid: int | None = None
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


State = Union[Pending, Processing, Completed[Any], Failed]


# --- What a push answers ------------------------------------------------------


@dataclass(frozen=True)
class Queued(Generic[T]):
    """The key was free (new, or failed before): this push claimed it and queued the job."""

    handle: JobHandle[T]


@dataclass(frozen=True)
class InFlight(Generic[T]):
    """The key is pending or running: this push joined that job instead of starting another."""

    handle: JobHandle[T]


@dataclass(frozen=True)
class Cached(Generic[T]):
    """The key completed before: here is its stored output; nothing ran."""

    output: T


PushOutcome = Union[Queued[Any], InFlight[Any], Cached[Any]]


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
    worker_restarts: int  # replacement workers started
    completed: int
    failed: int


@dataclass(frozen=True)
class QueueStats(_ItemAccess):
    """Counts of keys per state, and every lane's :class:`LaneStats`."""

    pending: int
    processing: int
    completed: int
    failed: int
    lanes: dict[str, LaneStats]

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)
