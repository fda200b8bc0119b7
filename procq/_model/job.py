"""What a job is and the lane it runs in: Job, its typed builder ``Job.of``, Lane.

Also the checks on time limits; byte sizes (``"512M"``) and a lane's worker
settings are checked in ``_model.settings`` (re-exported here). All of them are
frozen dataclasses, checked when made: they are handed across threads and
event loops and never change once made.
"""

from __future__ import annotations

import datetime
import math
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, ParamSpec, TypeVar

from procq._model.policies import Retry
from procq._model.sandbox import Sandbox, check_lane_sandbox
from procq._model.settings import (
    MAX_WORKERS,
    RLIMITS,
    check_cwd,
    check_env,
    check_kill_grace,
    check_rlimits,
    format_size,
    parse_size,
)

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_RESULT_VALUES",
    "DEFAULT_SPARE_WORKERS",
    "DEFAULT_UNTRUSTED_RESULT_BYTES",
    "MAX_WORKERS",
    "REUSE_POLICIES",
    "RLIMITS",
    "Job",
    "JobOf",
    "Lane",
    "Reuse",
    "check_wait",
    "format_size",
    "parse_size",
]

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")

#: How many waiting jobs a lane holds when its capacity is not given.
DEFAULT_CAPACITY = 1024

#: The largest result an untrusted lane accepts when its ``max_result_bytes`` is not given.
DEFAULT_UNTRUSTED_RESULT_BYTES = 16 * 1024 * 1024
#: How many JSON values an untrusted lane's result may hold by default (see ``Lane``).
DEFAULT_RESULT_VALUES = 1_000_000
#: How many warm spare workers a trusted lane keeps after a crash unless it says (see ``Lane``): none.
DEFAULT_SPARE_WORKERS = 0

#: How a terminal key answers a new push (see ``Job.reuse``).
Reuse = Literal["failed", "always", "never"]
REUSE_POLICIES = ("failed", "always", "never")


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
    # Past what a lock's wait can take (about 292 years) a wait is as good as endless.
    return None if value >= threading.TIMEOUT_MAX else float(value)


@dataclass(frozen=True, init=False)
class Job(Generic[T]):
    """One unit of work: a key, a function and its arguments.

    ``fn`` runs in a worker process, never in the supervisor. It may be a
    lambda, a closure or a local function: procq pickles it with cloudpickle.
    ``lane`` names the lane to run in (``None``: the queue's first lane).
    ``timeout`` is how many seconds the job may run once a worker has started
    it (``None``: the lane's ``timeout``); past that its worker's process tree
    is killed and the job fails with kind ``"timeout"``. ``memory_limit``
    (bytes, or a string such as ``"512M"``; ``None``: the lane's) bounds the
    memory the job may use; past it the job fails with kind ``"memory"``.

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
    memory_limit: int | None = None
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
        memory_limit: int | str | None = None,
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
            raise TypeError(f"job {key!r}: args must be a tuple or list, got {type(args).__name__}")
        if kwargs is not None:
            if not isinstance(kwargs, Mapping):
                raise TypeError(f"job {key!r}: kwargs must be a mapping or None, got {type(kwargs).__name__}")
            bad = [k for k in kwargs if not isinstance(k, str)]
            if bad:
                raise TypeError(f"job {key!r}: kwargs keys must be str, got {bad[0]!r}")
            kwargs = dict(kwargs)
        if lane is not None and not isinstance(lane, str):
            raise TypeError(f"job {key!r}: lane must be a str or None, got {type(lane).__name__}")
        if timeout is not None:
            timeout = _check_timeout(f"job {key!r}: timeout", timeout)
        if memory_limit is not None:
            memory_limit = parse_size(f"job {key!r}: memory_limit", memory_limit)
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
                raise ValueError(
                    f"job {key!r}: not_before as a delay must be a number of seconds >= 0, got {not_before!r}"
                )
            not_before = float(not_before)
        # Straight into the instance dict: the frozen class's __setattr__
        # refuses, and object.__setattr__ per field costs, at every push.
        fields = self.__dict__
        fields["key"] = key
        fields["fn"] = fn
        fields["args"] = args if type(args) is tuple else tuple(args)
        fields["kwargs"] = kwargs
        fields["lane"] = lane
        fields["timeout"] = timeout
        fields["memory_limit"] = memory_limit
        fields["reuse"] = reuse
        fields["retry"] = retry
        fields["not_before"] = not_before

    @staticmethod
    def of(
        key: str,
        fn: Callable[P, R],
        *,
        lane: str | None = None,
        timeout: float | None = None,
        memory_limit: int | str | None = None,
        reuse: Reuse | None = None,
        retry: Retry | None = None,
        not_before: datetime.datetime | float | None = None,
    ) -> JobOf[P, R]:
        """A typed builder: ``Job.of(key, fn, lane=...)(*args, **kwargs)`` is
        ``Job(key, fn, args, kwargs, lane=...)``, with the call's arguments
        checked by mypy against ``fn``'s parameters (see ``JobOf``)."""
        options = {"lane": lane, "timeout": timeout, "memory_limit": memory_limit, "reuse": reuse}
        return JobOf(key, fn, {**options, "retry": retry, "not_before": not_before})

    def __getstate__(self) -> dict[str, Any]:
        # Not the payload fingerprint procq may keep here (see
        # _fingerprint.job_fingerprint): it holds hashes of this process only.
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

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


class JobOf(Generic[P, T]):
    """A key, a function and a job's options, waiting for the function's
    arguments: ``builder(*args, **kwargs)`` makes the ``Job[T]``. It may be
    called any number of times; each call makes a job with the same key (so
    give each a key of its own, unless one piece of work is meant).

    ``Job(key, fn, args, kwargs)`` takes the arguments as a tuple and a dict,
    so no type checker can match them to ``fn``'s parameters; ``Job.of``
    returns this builder, typed with ``fn``'s ``ParamSpec``::

        job = Job.of("resize:42", resize, lane="cpu")(image_id=42, width=640)
        # Job[Image]; resize(image_id=42, width="640") would be a mypy error

    The two steps keep both kinds of keyword apart: the job's options
    (``lane``, ``timeout``, ``retry`` ...) go to ``Job.of``, and every keyword
    of the call goes to ``fn``, so a function with a parameter named ``lane``
    or ``timeout`` is still checked, and still receives it. (A one-call form
    cannot be typed: ``ParamSpec``'s ``**kwargs`` takes no neighbours.)"""

    __slots__ = ("fn", "key", "options")

    def __init__(self, key: str, fn: Callable[P, T], options: dict[str, Any]) -> None:
        Job(key, fn, **options)  # check the key, fn and options now, where the mistake is
        self.key = key
        self.fn = fn
        self.options = options

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Job[T]:
        return Job(self.key, self.fn, args, kwargs or None, **self.options)

    def __repr__(self) -> str:
        return f"<JobOf key={self.key!r} fn={getattr(self.fn, '__qualname__', self.fn)!r}>"


@dataclass(frozen=True)
class Lane:
    """A lane: how many workers run its jobs, how many jobs may wait, and the
    limits and isolation its workers run under.

    Concurrency:

    - ``workers``: at most this many jobs run at once, in that many worker processes.
    - ``capacity``: at most this many jobs wait for a worker; a push that finds
      the lane full blocks until one starts (or until its own timeout: ``LaneFull``).

    Per-job limits (a job's own ``timeout`` / ``memory_limit`` take precedence):

    - ``timeout``: seconds a job may run once started; then its process tree
      gets SIGTERM, ``kill_grace`` seconds later SIGKILL, and the job fails
      with kind ``"timeout"``.
    - ``memory_limit``: bytes (or ``"512M"``, ``"2G"``) a job may use; past it
      the job fails with kind ``"memory"`` (see docs/stopping.md for how it is enforced).
    - ``kill_grace``: seconds from a timeout's or a cancel's SIGTERM to the SIGKILL
      (0.05; at most an hour); ``close(wait=False)`` cuts it short.

    Worker recycling (between jobs; no job fails for it):

    - ``max_jobs_per_worker``: a worker that has run this many jobs is replaced.
    - ``max_worker_rss``: a worker whose resident memory is above this after a
      job is replaced.
    - ``spare_workers``: how many warm spare workers the lane keeps once one of
      its jobs has crashed (killed its worker). A spare is a booted worker
      that takes no job and does not count towards ``workers``: a worker that
      dies or retires is replaced at once by a spare, and a new spare boots in
      the background, so a crash costs no boot time. A lane with no crash
      keeps none. Default 0 (off): spares shorten a storm of crashes, but
      their boots compete for the CPU with the jobs and the waiters of the
      crashes themselves. Untrusted lanes (their workers outlive their
      jobs' crashes) and Dask lanes have none.

    Isolation:

    - ``trusted=False``: results and errors come back as JSON, decoded with a
      data-only codec, never with pickle; every message is checked, and one
      that breaks the protocol fails only its job (kind ``"protocol"``). Its
      workers are fresh interpreters that inherit nothing but their pipe, and
      never run job code: each job runs in a process of its own, forked for
      it by the worker, that holds no descriptor but a socket to the worker
      and exits after the job. So a job never sees another job's function,
      arguments or leftovers, nor the supervisor's pipe; its limits (CPU,
      ``memory_limit``, ``rlimits``) are hard and its own; a crash of its
      process fails the job (kind ``"crashed"``) and keeps the worker. The
      cost: a fork per job, and the job's modules imported in every job's
      process (milliseconds per job).
    - ``max_result_bytes``: a larger result fails its job (kind ``"protocol"``)
      without the supervisor reading it. Default: no limit for trusted lanes,
      ``DEFAULT_UNTRUSTED_RESULT_BYTES`` (16 MiB) for untrusted ones.
    - ``max_result_values`` (untrusted lanes): an answer whose JSON may hold more
      values than this (counted before decoding; it errs high) fails its job
      (kind ``"protocol"``) undecoded. Default ``DEFAULT_RESULT_VALUES`` (1,000,000).
    - ``rlimits``: ``{"cpu": seconds per job, "fsize": bytes, "nofile": n,
      "nproc": n}``, set in each worker before it takes a job (untrusted
      lanes: in each job's process). The kernel never applies ``nproc`` to
      root; a sandboxed lane's ``nproc`` binds as its ``max_processes`` does.
    - ``env``: the workers' environment variables. ``inherit_env``: whether they
      start from the supervisor's environment (default: trusted lanes do,
      untrusted ones do not).
    - ``cwd``: the workers' working directory.
    - ``sandbox`` (untrusted lanes): a ``procq.Sandbox`` (``True``: its
      defaults) of what each job may reach (files, network, processes,
      privileges) and how much it may take (processes, memory, temporary
      files; see docs/untrusted.md). Checked against the machine by ``ProcQueue()``.

    Set-up (trusted lanes):

    - ``initializer``, ``initargs``: ``initializer(*initargs)`` runs in each
      worker of the lane as it starts, before it takes a job (a replacement
      too), as ``ProcessPoolExecutor``'s ``initializer`` does. They travel
      with the worker's start, not with each job: ``initargs`` may hold what
      ``multiprocessing`` passes only to a process it starts (a ``Queue``,
      ``Lock``, ``Event`` or ``Value`` of the queue's start method's
      context). The initializer and the lane's job functions that are
      defined at the top level of the main script run as the worker's own
      main module defines them, so they share its globals: what the
      initializer sets, the jobs read (elsewhere procq sends a main script's
      function by value). One that raises does not stop the worker: the
      worker's next job fails with ``procq.InitializerFailed`` (naming its
      exception) without running, and the job after it runs the initializer
      again first. One that kills its process is a worker that died as it
      started. ``ProcQueue()`` raises ``JobPicklingError`` if they cannot be
      pickled.
    """

    workers: int = 1
    capacity: int = DEFAULT_CAPACITY
    timeout: float | None = None
    memory_limit: int | str | None = None
    max_jobs_per_worker: int | None = None
    max_worker_rss: int | str | None = None
    trusted: bool = True
    max_result_bytes: int | str | None = None
    rlimits: Mapping[str, int | str] | None = None
    env: Mapping[str, str] | None = None
    inherit_env: bool | None = None
    cwd: str | os.PathLike[str] | None = None
    kill_grace: float = 0.05
    max_result_values: int = DEFAULT_RESULT_VALUES
    spare_workers: int | None = None
    sandbox: Sandbox | bool | None = None
    initializer: Callable[..., object] | None = None
    # (Neither compared nor hashed: the arguments may be lists or arrays.)
    initargs: tuple[Any, ...] = field(default=(), compare=False)

    #: Are its workers elsewhere than on this machine (``DaskLane``)? Then the
    #: limits that act on a job's process (time, memory) are enforced where it
    #: runs, not by the supervisor, and no job is sent ahead to a busy worker.
    remote: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int):
            raise TypeError(f"lane workers must be an int, got {type(self.workers).__name__}")
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int):
            raise TypeError(f"lane capacity must be an int, got {type(self.capacity).__name__}")
        if self.workers < 1:
            raise ValueError(f"a lane needs at least 1 worker, got {self.workers}")
        if self.workers > MAX_WORKERS:
            raise ValueError(
                f"lane workers must be at most {MAX_WORKERS} (each is a process of its own), got {self.workers}"
            )
        if self.capacity < 0:
            raise ValueError(f"a lane's capacity must be 0 or more, got {self.capacity}")
        _set = object.__setattr__
        _set(self, "timeout", _check_timeout("lane timeout", self.timeout))
        _set(self, "memory_limit", parse_size("lane memory_limit", self.memory_limit))
        _set(self, "max_worker_rss", parse_size("lane max_worker_rss", self.max_worker_rss))
        n = self.max_jobs_per_worker
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"lane max_jobs_per_worker must be an int of at least 1 or None, got {n!r}")
        if not isinstance(self.trusted, bool):
            raise TypeError(f"lane trusted must be a bool, got {type(self.trusted).__name__}")
        limit = parse_size("lane max_result_bytes", self.max_result_bytes)
        if limit is None and not self.trusted:
            limit = DEFAULT_UNTRUSTED_RESULT_BYTES
        _set(self, "max_result_bytes", limit)
        values = self.max_result_values
        if isinstance(values, bool) or not isinstance(values, int) or values < 1:
            raise ValueError(f"lane max_result_values must be an int of at least 1, got {values!r}")
        _set(self, "rlimits", check_rlimits(self.rlimits))
        if self.env is not None:
            _set(self, "env", check_env(self.env))
        if self.inherit_env is None:
            _set(self, "inherit_env", self.trusted)
        elif not isinstance(self.inherit_env, bool):
            raise TypeError(f"lane inherit_env must be a bool or None, got {type(self.inherit_env).__name__}")
        if self.cwd is not None:
            if not isinstance(self.cwd, (str, os.PathLike)):
                raise TypeError(f"lane cwd must be a path, got {type(self.cwd).__name__}")
            _set(self, "cwd", check_cwd(self.cwd))
        _set(self, "kill_grace", check_kill_grace(self.kill_grace))
        _set(self, "spare_workers", self._check_spares(self.spare_workers))
        _set(self, "sandbox", check_lane_sandbox(self.sandbox, self.trusted))
        self._check_initializer()

    def _check_initializer(self) -> None:
        if self.initializer is not None and not callable(self.initializer):
            raise TypeError(f"lane initializer must be a callable or None, got {type(self.initializer).__name__}")
        if not isinstance(self.initargs, tuple):
            raise TypeError(f"lane initargs must be a tuple, got {type(self.initargs).__name__}")
        if self.initargs and self.initializer is None:
            raise ValueError("lane initargs were given without an initializer")
        if self.initializer is not None and not self.trusted:
            raise ValueError(
                "an untrusted lane has no initializer: each of its jobs runs in a fresh process of its own, "
                "so call the set-up at the start of the job"
            )

    def _check_spares(self, n: int | None) -> int:
        """``spare_workers`` resolved: None is the default, none for a lane that cannot have spares."""
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_WORKERS):
            raise ValueError(f"lane spare_workers must be an int from 0 to {MAX_WORKERS} or None, got {n!r}")
        if self.trusted and not self.remote:
            return DEFAULT_SPARE_WORKERS if n is None else n
        if n:
            raise ValueError(
                f"lane spare_workers must be 0 or None for an untrusted lane (its workers outlive "
                f"their jobs' crashes), got {n}"
            )
        return 0

    # After __post_init__ these hold the normalized values; typed accessors for the engine.
    @property
    def memory_limit_bytes(self) -> int | None:
        return self.memory_limit  # type: ignore[return-value]

    @property
    def max_worker_rss_bytes(self) -> int | None:
        return self.max_worker_rss  # type: ignore[return-value]

    @property
    def max_result(self) -> int | None:
        return self.max_result_bytes  # type: ignore[return-value]

    @property
    def spares(self) -> int:
        return self.spare_workers  # type: ignore[return-value]
