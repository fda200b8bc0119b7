"""procq's public values: jobs, lanes, the four key states, push outcomes, failures, stats.

All of them are frozen dataclasses: they are handed across threads and event
loops and never change once made.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generic, Literal, Mapping, TypeVar, Union

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
    "RETRYABLE_KINDS",
    "Retention",
    "Retry",
    "Reuse",
    "State",
]

T = TypeVar("T")

#: How many waiting jobs a lane holds when its capacity is not given.
DEFAULT_CAPACITY = 1024

#: How a terminal key answers a new push (see ``Job.reuse``).
Reuse = Literal["failed", "always", "never"]
REUSE_POLICIES = ("failed", "always", "never")

#: The failure kinds a ``Retry`` may retry. ``"cancelled"`` is never retried:
#: a cancelled job was stopped on purpose.
RETRYABLE_KINDS = frozenset({"error", "crashed", "timeout", "memory", "protocol"})


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

    ``reuse`` says how a key that already ended answers this push
    (``None``: the queue's default, ``"failed"`` unless the queue says
    otherwise): ``"failed"`` runs a failed key again and answers a completed
    one with its output; ``"always"`` runs any ended key again; ``"never"``
    runs no ended key again (a failed one answers with its failure).
    ``retry`` (a :class:`Retry`) runs a failed attempt again after a backoff.
    ``not_before`` (a ``datetime``, or a delay in seconds from the push)
    holds the job until then.
    """

    key: str
    fn: Callable[..., T]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] | None = None
    lane: str | None = None
    timeout: float | None = None
    reuse: Reuse | None = None
    retry: Retry | None = None
    not_before: datetime.datetime | float | None = None

    def __init__(
        self,
        key: str,
        fn: Callable[..., T],
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        lane: str | None = None,
        timeout: float | None = None,
        reuse: Reuse | None = None,
        retry: Retry | None = None,
        not_before: datetime.datetime | float | None = None,
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
        if reuse is not None and reuse not in REUSE_POLICIES:
            raise ValueError(f"job {key!r}: reuse must be 'failed', 'always', 'never' or None, got {reuse!r}")
        if retry is not None and not isinstance(retry, Retry):
            raise TypeError(f"job {key!r}: retry must be a procq.Retry or None, got {type(retry).__name__}")
        if not_before is not None and not isinstance(not_before, datetime.datetime):
            if isinstance(not_before, bool) or not isinstance(not_before, (int, float)):
                raise TypeError(
                    f"job {key!r}: not_before must be a datetime, a delay in seconds or None, "
                    f"got {type(not_before).__name__}"
                )
            if not math.isfinite(not_before) or not_before < 0:
                raise ValueError(f"job {key!r}: not_before as a delay must be a number of seconds >= 0, got {not_before!r}")
            not_before = float(not_before)
        object.__setattr__(self, "reuse", reuse)
        object.__setattr__(self, "retry", retry)
        object.__setattr__(self, "not_before", not_before)

    def due(self, now: float) -> float | None:
        """When the job may start, on the ``time.monotonic()`` clock (None: at once).

        A delay counts from ``now`` (the push); a ``datetime`` is converted
        through the wall clock at the same moment (a naive one is local time).
        """
        nb = self.not_before
        if nb is None:
            return None
        if isinstance(nb, datetime.datetime):
            wall = datetime.datetime.now(nb.tzinfo)
            return now + (nb - wall).total_seconds()
        return now + nb


@dataclass(frozen=True)
class Retry:
    """Run a failed attempt again, after a growing backoff.

    At most ``attempts`` attempts run in all (the first included). After
    attempt ``n`` fails with a kind in ``on``, attempt ``n + 1`` starts
    ``min(max_backoff, backoff * factor ** (n - 1))`` seconds later, that
    delay scaled by a random factor in ``[1 - jitter, 1 + jitter]``. Between
    attempts the key stays live: ``state()`` is ``Pending(attempt=n + 1)`` and
    a push joins it (``InFlight``). The key becomes ``Failed`` only when an
    attempt fails with a kind not in ``on`` or the last attempt fails; that
    failure says how many attempts ran and why each failed.

    ``on`` takes kinds from ``"error"``, ``"crashed"``, ``"timeout"``,
    ``"memory"`` and ``"protocol"``; a ``"cancelled"`` job is never retried.
    """

    attempts: int = 3
    backoff: float = 0.1
    factor: float = 2.0
    max_backoff: float = 30.0
    jitter: float = 0.2
    on: tuple[str, ...] = ("crashed", "timeout", "error")

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise TypeError(f"Retry attempts must be an int, got {type(self.attempts).__name__}")
        if self.attempts < 1:
            raise ValueError(f"Retry needs at least 1 attempt, got {self.attempts}")
        for name in ("backoff", "factor", "max_backoff", "jitter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise TypeError(f"Retry {name} must be a finite number, got {value!r}")
            if value < 0:
                raise ValueError(f"Retry {name} must be >= 0, got {value!r}")
        if self.factor < 1:
            raise ValueError(f"Retry factor must be >= 1 (a backoff never shrinks), got {self.factor!r}")
        if self.jitter > 1:
            raise ValueError(f"Retry jitter must be between 0 and 1, got {self.jitter!r}")
        on = self.on
        if isinstance(on, str):
            on = (on,)
        if not isinstance(on, (tuple, list, set, frozenset)):
            raise TypeError(f"Retry on must be a tuple of failure kinds, got {type(on).__name__}")
        for kind in on:
            if kind == "cancelled":
                raise ValueError("Retry on cannot include 'cancelled': a cancelled job is never retried")
            if kind not in RETRYABLE_KINDS:
                known = ", ".join(repr(k) for k in sorted(RETRYABLE_KINDS))
                raise ValueError(f"Retry on: unknown failure kind {kind!r}; the kinds are {known}")
        object.__setattr__(self, "on", tuple(on))

    def delay(self, attempt: int, rand: float) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based), for a
        ``rand`` drawn uniformly from [0, 1)."""
        base = min(self.max_backoff, self.backoff * self.factor ** (attempt - 1))
        return max(0.0, base * (1.0 + self.jitter * (2.0 * rand - 1.0)))


@dataclass(frozen=True)
class Retention:
    """How long a queue keeps keys that ended. The default keeps every key forever.

    - ``ttl``: a completed key is dropped this many seconds after it completed.
    - ``max_completed``: at most this many completed keys are kept; beyond it
      the least recently used are dropped (a push answered ``Cached`` and a
      ``state()`` read count as uses).
    - ``failed_ttl``: a failed key's record (what ``state()`` reports) is
      dropped this many seconds after it failed. A failed key stays retryable
      either way.

    A dropped key is as if never pushed: ``state()`` is ``None`` and the next
    push runs it. Expiry is decided from the times stored with each key
    whenever the key is read, so an expired key is never answered from the
    store; the memory of expired keys is reclaimed as the queue is used.
    """

    ttl: float | None = None
    max_completed: int | None = None
    failed_ttl: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttl", "failed_ttl"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"Retention {name} must be a number of seconds or None, got {type(value).__name__}")
            if math.isnan(value) or value < 0:
                raise ValueError(f"Retention {name} must be None or a number of seconds >= 0, got {value!r}")
        limit = self.max_completed
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int):
                raise TypeError(f"Retention max_completed must be an int or None, got {type(limit).__name__}")
            if limit < 0:
                raise ValueError(f"Retention max_completed must be >= 0, got {limit}")

    @property
    def bounded(self) -> bool:
        return self.ttl is not None or self.max_completed is not None or self.failed_ttl is not None


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
    """Claimed; no worker has started it yet (waiting in its lane, for its
    ``not_before`` time, or for its retry backoff).

    ``attempt`` is the attempt that will run next: 1, or more while a job
    with a ``Retry`` waits to run again. ``Pending() == Pending(attempt=1)``.
    """

    attempt: int = 1


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

    ``attempts`` is how many attempts ran (more than 1 only with a ``Retry``);
    ``history`` then holds each attempt's own failure, first to last, and the
    message lists them.
    """

    kind: str
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
    retries: int = 0  # failed attempts that a Retry ran again


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
