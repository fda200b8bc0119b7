"""procq: keyed jobs in supervised worker processes.

Every job carries a key. Pushing a key that is running joins it (``InFlight``),
one that completed returns its stored output (``Cached``), one that failed runs
fresh (``Queued``). The process that opens the queue is the supervisor; every
job runs in a child worker process, and a child that crashes fails only its own
job::

    from procq import ProcQueue, Job

    with ProcQueue(lanes={"cpu": 2}) as q:
        print(q.push_and_wait(Job("square:7", pow, args=(7, 2))))
"""

from typing import TYPE_CHECKING, Any

# The public names are loaded on first use, not at import: worker processes
# import this package too (to reach procq._worker), and should not pay for the
# supervisor's side (asyncio, threading machinery) on every start.
_SOURCES = {
    "JobFailed": "procq._errors",
    "JobPicklingError": "procq._errors",
    "KeyConflict": "procq._errors",
    "KeyConflictWarning": "procq._errors",
    "LaneFull": "procq._errors",
    "ProcQueueError": "procq._errors",
    "QueueClosed": "procq._errors",
    "JobHandle": "procq._handle",
    "ProcQueue": "procq._queue",
    "Job": "procq._job",
    "Lane": "procq._job",
    "Retention": "procq._job",
    "Retry": "procq._job",
    "Cached": "procq._values",
    "Completed": "procq._values",
    "Failed": "procq._values",
    "Failure": "procq._values",
    "FailureKind": "procq._values",
    "InFlight": "procq._values",
    "LaneStats": "procq._values",
    "Pending": "procq._values",
    "Processing": "procq._values",
    "QueueStats": "procq._values",
    "Queued": "procq._values",
}

if TYPE_CHECKING:
    from procq._errors import (
        JobFailed,
        JobPicklingError,
        KeyConflict,
        KeyConflictWarning,
        LaneFull,
        ProcQueueError,
        QueueClosed,
    )
    from procq._handle import JobHandle
    from procq._job import Job, Lane, Retention, Retry
    from procq._queue import ProcQueue
    from procq._values import (
        Cached,
        Completed,
        Failed,
        Failure,
        FailureKind,
        InFlight,
        LaneStats,
        Pending,
        Processing,
        Queued,
        QueueStats,
    )


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module 'procq' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SOURCES))


__version__ = "0.1.0"

__all__ = [
    "Cached",
    "Completed",
    "Failed",
    "Failure",
    "FailureKind",
    "InFlight",
    "Job",
    "JobFailed",
    "JobHandle",
    "JobPicklingError",
    "KeyConflict",
    "KeyConflictWarning",
    "Lane",
    "LaneFull",
    "LaneStats",
    "Pending",
    "ProcQueue",
    "ProcQueueError",
    "Processing",
    "QueueClosed",
    "QueueStats",
    "Queued",
    "Retention",
    "Retry",
]
