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

from procq._errors import JobFailed, LaneFull, ProcQueueError, QueueClosed
from procq._handle import JobHandle
from procq._queue import ProcQueue
from procq._values import (
    Cached,
    Completed,
    Failed,
    Failure,
    InFlight,
    Job,
    Lane,
    LaneStats,
    Pending,
    Processing,
    QueueStats,
    Queued,
)

__version__ = "0.1.0"

__all__ = [
    "Cached",
    "Completed",
    "Failed",
    "Failure",
    "InFlight",
    "Job",
    "JobFailed",
    "JobHandle",
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
]
