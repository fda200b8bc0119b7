"""procq's exceptions.

The tree is small on purpose, and keeps "you closed it" apart from "it broke"::

    Exception
    ├── ProcQueueError            base of everything procq raises about the queue itself
    │   ├── KeyConflict           (also a ValueError) a push's payload differs from the key's job
    │   ├── LaneFull              (also a TimeoutError) a push waited for room past its timeout
    │   ├── QueueClosed           a push after close(): you closed it, nothing broke
    │   ├── SandboxUnavailable    a sandboxed lane asks for a part this kernel cannot enforce
    │   └── WrongProcess          the queue was used from a process that did not open it (after os.fork())
    ├── JobFailed                 a job ended in Failed; .key and .failure say which and why
    │   └── BrokenJob             (also concurrent.futures' BrokenProcessPool) what an Executor's future
    │                             raises where ProcessPoolExecutor's would be broken: one job, not the pool
    ├── TypeError, pickle.PicklingError
    │   └── JobPicklingError      a push's function or arguments cannot be pickled
    └── UserWarning
        └── KeyConflictWarning    as KeyConflict, with ProcQueue(on_mismatch="warn")

``BrokenJob`` exists for code written for ``ProcessPoolExecutor``, which
catches ``BrokenProcessPool`` from ``future.result()`` (and often rebuilds its
pool then): ``procq.Executor``'s futures raise it where the job's worker died
(kind ``"crashed"``), broke procq's protocol, or the job's arguments or
outcome could not cross between the processes and no exception of the job's
came back. Only the executor's futures raise it: a ``ProcQueue`` handle raises
plain ``JobFailed``, its contract, and no ``except RuntimeError`` in code
written for ``ProcQueue`` starts catching job failures. It lives in
``procq._api.futures``, with the futures that raise it: importing
``concurrent.futures`` is left to programs that use them.

``JobFailed`` is deliberately not a ``ProcQueueError``: the queue is healthy, one
job's work failed. Where the job raised an exception that could be unpickled in
the supervisor, that exception is ``JobFailed.__cause__``, and the child's
formatted traceback is in turn chained below it (as in ``concurrent.futures``).
Where there is a traceback but no exception to unpickle (the job's function,
arguments or result could not be unpickled, an untrusted lane's exception,
which crosses as text), the traceback's text is ``JobFailed.__cause__``
itself (a ``_RemoteTraceback``, as loky and ``concurrent.futures`` chain it).

Bad arguments (unknown lane, a key that is not a str, an fn that is not
callable) raise the built-in ``ValueError`` or ``TypeError`` at once, with a
message that names the problem; a function or argument that cannot be pickled
raises ``JobPicklingError``, both a ``TypeError`` and a ``pickle.PicklingError``.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from procq._model.values import Failure

__all__ = [
    "JobFailed",
    "JobPicklingError",
    "KeyConflict",
    "KeyConflictWarning",
    "LaneFull",
    "ProcQueueError",
    "QueueClosed",
    "SandboxUnavailable",
    "WrongProcess",
]


class ProcQueueError(Exception):
    """Base class of the errors procq raises about the queue itself."""

    __module__ = "procq"  # its public name, printed and pickled as procq.<name>


class LaneFull(ProcQueueError, TimeoutError):
    """A push waited for room in a full lane longer than its ``timeout``.

    The key is left exactly as it was before the push.
    """

    __module__ = "procq"  # its public name, printed and pickled as procq.<name>


class KeyConflict(ProcQueueError, ValueError):
    """A push names a key whose job (live, or kept after it ended) has a
    different payload: another function, or other arguments.

    ``key`` is the key, ``differs`` what differs (``"function"`` or
    ``"arguments"``). Nothing changed: the key is left as it was. Raised with
    ``ProcQueue(on_mismatch="raise")``.
    """

    __module__ = "procq"  # its public name, printed and pickled as procq.<name>

    def __init__(self, message: str, key: str, differs: str) -> None:
        super().__init__(message)
        self.key = key
        self.differs = differs

    def __reduce__(self) -> tuple[type[KeyConflict], tuple[str, str, str]]:
        return (type(self), (str(self), self.key, self.differs))


class KeyConflictWarning(UserWarning):
    """What ``KeyConflict`` says, as a warning: ``ProcQueue(on_mismatch="warn")``."""

    __module__ = "procq"  # its public name, printed and pickled as procq.<name>


class QueueClosed(ProcQueueError):
    """The queue is closed (or closing) and takes no new pushes."""

    __module__ = "procq"  # its public name, printed and pickled as procq.<name>


class SandboxUnavailable(ProcQueueError):
    """A sandboxed lane asks for a part of its ``Sandbox`` that this kernel
    cannot enforce (no Landlock, an older Landlock ABI, user namespaces
    refused, no seccomp table for this machine), and the ``Sandbox`` did not
    relax it. Raised by ``ProcQueue()``, before any worker starts. ``part``
    names the part (``"files"``, ``"namespaces"``, ``"network"``,
    ``"processes"`` or ``"privileges"``); the message says why and how to
    relax it. A bound (``"max_processes"``, ``"max_memory"``, ``"max_tmp"``)
    that nothing here can enforce (no cgroup this process may make, a root
    supervisor that ``RLIMIT_NPROC`` does not bind, no namespaces to size a
    tmpfs in) raises it too, with ``part`` naming the bound. A sandbox never
    runs weaker than asked without saying so.
    """

    __module__ = "procq"  # its public name, printed and pickled as procq.<name>

    def __init__(self, message: str, part: str) -> None:
        super().__init__(message)
        self.part = part

    def __reduce__(self) -> tuple[type[SandboxUnavailable], tuple[str, str]]:
        return (type(self), (str(self), self.part))


class WrongProcess(ProcQueueError):
    """The queue was used from a process other than the one that opened it.

    A child made with ``os.fork()`` (or a ``multiprocessing`` fork) holds a
    copy of its parent's queue: copies of the parent's pipes to its workers,
    and a copy of the state map that no thread keeps up to date. Using it would
    write into the parent's workers, so every method that would touch them,
    or the state map, raises this instead; the parent's queue is untouched.
    ``owner_pid`` is the process that opened the queue, ``pid`` this one.
    """

    __module__ = "procq"  # its public name, printed and pickled as procq.<name>

    def __init__(self, owner_pid: int, pid: int) -> None:
        super().__init__(
            f"this ProcQueue belongs to process {owner_pid}, which opened it; process {pid} is a copy made "
            f"by fork and cannot use it (its workers, pipes and keys are the parent's): open a new ProcQueue "
            f"in the child"
        )
        self.owner_pid = owner_pid
        self.pid = pid

    def __reduce__(self) -> tuple[type[WrongProcess], tuple[int, int]]:
        return (type(self), (self.owner_pid, self.pid))


class JobPicklingError(TypeError, pickle.PicklingError):
    """A job's function or arguments could not be pickled to send to a worker.

    Raised by a push, which leaves the key as it was. It is a ``TypeError`` (a
    bad argument) and a ``pickle.PicklingError``, so either ``except`` catches it.
    """

    __module__ = "procq"  # its public name, printed and pickled as procq.<name>


class _RemoteTraceback(Exception):
    """Carries the child's formatted traceback as the cause of a job's exception."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


class JobFailed(Exception):
    """A job ended in ``Failed``.

    ``key`` is the job's key and ``failure`` the :class:`procq.Failure` that
    says how it failed. ``failure.kind`` (a :data:`procq.FailureKind`) is
    ``"error"`` (the job raised), ``"crashed"`` (its worker died),
    ``"timeout"`` (it ran past its time limit), ``"cancelled"`` (cancelled, or
    abandoned before it ran), ``"memory"`` (it went over its memory limit) or
    ``"protocol"`` (its worker broke procq's protocol); ``Failure`` says more
    about each.

    ``item`` says, for a job of ``q.map``, which of the map's items it ran
    (``"item 2 ('boom')"``, or for a chunk ``"items 10-19 (...)"``), and
    starts the message; else it is None.
    """

    __module__ = "procq"  # its public name, printed and pickled as procq.<name>

    def __init__(self, key: str, failure: Failure, item: str | None = None) -> None:
        super().__init__(key, failure)
        self.key = key
        self.failure = failure
        self.item = item

    def __str__(self) -> str:
        text = f"job {self.key!r} failed: {self.failure}"
        return text if self.item is None else f"map {self.item}: {text}"

    def __reduce__(self) -> tuple[type[JobFailed], tuple[str, Failure, str | None]]:
        return (type(self), (self.key, self.failure, self.item))
