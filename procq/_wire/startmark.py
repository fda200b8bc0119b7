"""Which job a worker last started: a word of memory the worker and the supervisor share.

A worker that dies is blamed for the job it held only if it had started
that job. Its pipe cannot say so: a worker killed while idle dies before it
reads the job it is sent next, and a job frame read and a job started are
not the same moment either (jobs sent ahead wait behind the running one).
An acknowledgement on the pipe would cost a write in the worker and a
wake-up of the supervisor per job.

So each local worker gets an anonymous page of shared memory (a ``memfd``,
mapped by both sides; it has no name to leak, and the kernel frees it with
its last mapping). Just before a job's code can first run (before its
function and arguments are unpickled: unpickling may run the job's code),
the process that runs it stores the job's id in the page: one store, no
system call. When the worker dies, the supervisor reads the page: the job
it held was started there if, and only if, the page holds that job's id
(ids are never reused: a retry has a new one). An untrusted job's process
writes its id the same way, then unmaps the page before the job runs, so
hostile code cannot forge it.

A trusted worker also says there what it holds as a job with a memory
limit starts (its proportional set size, after it has let go of the result
segments it keeps mapped), in a second word written before the id: that job's
memory is counted from there (``StartMark.base``), not from what the
worker held when the job was sent (it may map, or stop sharing, pages in
between that are none of the job's).

Where ``os.memfd_create`` is missing (not Linux) there is no page, and
every held job counts as started, as before.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from multiprocessing import reduction
from typing import Any

from procq._model.values import Failed

__all__ = ["StartMark", "Unstarted", "WorkerMark", "open_mark"]

_SIZE = 16  # signed 64-bit words in native byte order: the job's id, then the worker's memory as it started


class StartMark:
    """The supervisor's side: made per worker, read after its death."""

    __slots__ = ("_fd", "_map", "_view")

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._map = mmap.mmap(fd, _SIZE)
        self._view = memoryview(self._map).cast("q")

    @classmethod
    def create(cls) -> StartMark | None:
        """A fresh page (holding 0, no job's id), or None where the platform has none."""
        make = getattr(os, "memfd_create", None)
        if make is None:
            return None
        fd = make("procq-started", getattr(os, "MFD_CLOEXEC", 1))
        try:
            os.ftruncate(fd, _SIZE)
            return cls(fd)
        except BaseException:
            os.close(fd)
            raise

    def fileno(self) -> int:
        """The page's descriptor, to hand to the worker as it starts (None after ``close``)."""
        return self._fd

    def for_child(self) -> WorkerMark:
        """What a ``multiprocessing`` child's start arguments carry."""
        return WorkerMark(self._fd)

    def started(self) -> int:
        """The id of the last job the worker started (0: none)."""
        return int(self._view[0])

    def base(self, job_id: int) -> int | None:
        """What the worker held, in bytes, as it started job ``job_id`` (one
        with a memory limit); None until it has started it. (The worker
        writes the size, then the id: read the other way round.)"""
        if self._view[0] != job_id:
            return None
        base = int(self._view[1])
        return base if self._view[0] == job_id else None

    def close_fd(self) -> None:
        """The worker has its own copy: the supervisor keeps only the mapping."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        self.close_fd()
        self._view.release()
        self._map.close()


class WorkerMark:
    """The page's descriptor as a ``multiprocessing`` child's start
    arguments carry it: duplicated into the child as they are pickled, as a
    ``Connection`` is (inherited as it is under the fork start method)."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (reduction.DupFd(self.fd),)


def _rebuild(dup: Any) -> WorkerMark:
    return WorkerMark(dup.detach())


def open_mark(fd: int | None) -> memoryview | None:
    """The worker's side: the page as writable ``int64`` words (``mark[1] =
    memory``, then ``mark[0] = job_id``), its descriptor closed (the mapping
    stays). None without a page."""
    if fd is None:
        return None
    try:
        page = mmap.mmap(fd, _SIZE)
    finally:
        os.close(fd)
    return memoryview(page).cast("q")


@dataclass(frozen=True)
class Unstarted(Failed):
    """A report's outcome (never a key's state): the process forked to run
    the job died before the job started, so the job goes back to its lane.
    ``failure`` is what it ends with if that keeps happening
    (``_core.dispatch.UNSTARTED_DEATHS_TO_FAIL``)."""
