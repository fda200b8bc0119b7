"""What the core's lane operations answer: an offer of a claimed job to its
lane (``Offered``, ``Offer``), a worker's reports (``Reported``) and a blocked
push's wait (``Unblocked``)."""

from __future__ import annotations

import enum

from procq._core.entries import WorkerSlot

__all__ = ["Offer", "Offered", "Reported", "Unblocked"]


class Offered(enum.Enum):
    """What offering a claimed entry to its lane came to (short of a worker taking it)."""

    QUEUED = "queued"  # accepted into the lane's ready queue
    FULL = "full"  # no room; nothing changed
    BLOCKED = "blocked"  # no room; the push now waits in the lane's blocked queue
    STOPPED = "stopped"  # the supervisor has stopped: nothing will ever run the job
    CANCELLED = "cancelled"  # q.cancel() came before the lane: the job ended, cancelled
    SCHEDULED = "scheduled"  # waits for its not_before time, then enters its lane


#: A worker (the caller sends it the job) or what else became of the offer.
Offer = WorkerSlot | Offered


class Reported(str, enum.Enum):
    """What a worker's reports came to (a ``str``, so it compares equal to its value)."""

    DONE = "done"  # settled; the worker takes jobs (if any were waiting, they are to be sent)
    RETIRE = "retire"  # the worker must now be replaced: its pipe closed, a new one started
    UNEXPECTED = "unexpected"  # a report was not for the job the worker holds: a protocol violation


class Unblocked(str, enum.Enum):
    """How a blocked push's wait ended (a ``str``, so it compares equal to its value)."""

    ACCEPTED = "accepted"  # its lane took it first: the push succeeded after all
    ABANDONED = "abandoned"  # it never reached its lane: its claim is released
