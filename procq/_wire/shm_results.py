"""A trusted worker's large results through shared memory: the segments a
worker writes them into (``ResultSegments``), the message that names one
(``MappedFrame``), and the supervisor's mapping of it (``map_result``).

A result's buffers go into a segment named ``procq-<supervisor pid>-w<worker
pid>-<n>`` in ``SHM_DIR``, after a header of ``ALIGN`` bytes. The supervisor
maps it copy-on-write: a numpy array in the result is a view of that mapping,
with no copy.

A new segment's pages are allocated and zeroed by the kernel as they are
first written, several times slower than a copy into pages already there. So
a worker keeps its last result segments (at most ``KEEP_RESULT_SEGMENTS``,
``KEEP_RESULT_BYTES`` in all, and only while it is busy: idle for a second,
it lets go of them, ``trim``) and writes a later result into one of them,
mapped once and kept mapped, at memory speed. It may do so only once nothing
of the supervisor's maps it: a copy-on-write mapping still shows what is
written to the file where it has not written itself. The header says whose
a segment is: a random *token*, which names this segment's life (a worker
with the same pid later makes segments with other tokens), and a state:

- ``_SENT``: written, and the result sent. The supervisor's, until the last
  object made from its mapping is gone; then it writes ``_FREE``
  (``_let_go``, a finalizer of the mapping).
- ``_FREE``: the worker's again, to write the next result into.
- ``_ORPHAN``: the worker dropped it from its keep while the supervisor had it
  (or had its message still to read): the supervisor removes its name as it
  lets go (or as it reads the message).

Each side changes the state only under an exclusive ``flock`` of the file,
reading it again first. A segment the worker does not keep (larger than ``KEEP_RESULT_BYTES``) has
token 0, and the supervisor removes its name as it maps it. A kept one's
name is the worker's: removed as the worker drops it from its keep, or by
the supervisor's sweep of the worker's names as it reaps it (``shm.sweep``),
or by the undertaker if the supervisor is killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import pickle
import struct
import weakref
from collections.abc import Callable
from typing import Any

from procq._wire import shm
from procq._wire.shm import ALIGN, Spans

__all__ = ["KEEP_RESULT_BYTES", "KEEP_RESULT_SEGMENTS", "MappedFrame", "ResultSegments", "map_result"]

#: At most this many result segments, and this many bytes of them, a worker keeps to write again.
KEEP_RESULT_SEGMENTS = 2
KEEP_RESULT_BYTES = 1 << 30
#: A result segment's first bytes: its token and its state.
_HEADER = struct.Struct("<QQ")
_SENT = 1
_FREE = 2
_ORPHAN = 3


class _Kept:
    """A result segment a worker keeps: open, and mapped once it is written a second time."""

    __slots__ = ("fd", "mapped", "name", "size", "token")

    def __init__(self, fd: int, name: str, size: int, token: int) -> None:
        self.fd = fd
        self.name = name
        self.size = size
        self.token = token
        self.mapped: mmap.mmap | None = None

    def is_free(self) -> bool:
        return _HEADER.unpack(os.pread(self.fd, _HEADER.size, 0)) == (self.token, _FREE)

    def map(self) -> mmap.mmap:
        if self.mapped is None:
            # Populated at once: one call maps every page, where faulting them in one by one costs more than the copy.
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self.mapped = mmap.mmap(self.fd, self.size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        return self.mapped

    def rewrite(self, spans: Spans, buffers: list[pickle.PickleBuffer], pieces: list[Any], mapped: bool) -> None:
        if not mapped:
            shm.write_all(self.fd, pieces, ALIGN)
            os.pwrite(self.fd, _HEADER.pack(self.token, _SENT), 0)
            return
        with memoryview(self.map()) as whole:
            for (offset, length), buffer in zip(spans, buffers, strict=True):
                if length:
                    whole[offset : offset + length] = buffer.raw()
        os.pwrite(self.fd, _HEADER.pack(self.token, _SENT), 0)

    def unmap(self) -> None:
        with contextlib.suppress(OSError, BufferError):
            if self.mapped is not None:
                self.mapped.close()
        self.mapped = None

    def drop(self) -> None:
        """Out of the keep: its name removed now, or by the supervisor if it still has it."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            if _HEADER.unpack(os.pread(self.fd, _HEADER.size, 0)) == (self.token, _SENT):
                os.pwrite(self.fd, _HEADER.pack(self.token, _ORPHAN), 0)
            else:
                shm.unlink_segment(self.name)
            fcntl.flock(self.fd, fcntl.LOCK_UN)  # (the mapping's duplicate of fd would hold it)
        except OSError:
            shm.unlink_segment(self.name)
        finally:
            self.unmap()
            with contextlib.suppress(OSError):
                os.close(self.fd)  # (and its lock)


class ResultSegments:
    """A trusted worker's result segments: ``write`` puts a result's buffers
    into a kept segment the supervisor is done with, or into a new one."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix  # the supervisor's (shm.segment_prefix)
        self._kept: list[_Kept] = []  # the oldest first
        self._pid = os.getpid()
        self._mapped = True  # keep the kept ones mapped (see no_mappings)

    def no_mappings(self) -> None:
        """From now on keep no segment mapped (write them with ``pwritev``,
        about half as fast): a job with a memory limit is about to run, and
        the pages of a kept segment the supervisor still maps would count
        towards it, more of them as the supervisor lets go of them."""
        if self._mapped:
            self._mapped = False
            for kept in self._kept:
                kept.unmap()

    def kept(self) -> bool:
        return bool(self._kept)

    def prepare(self) -> None:
        """Map the kept segments not mapped yet (the worker has nothing else
        to do): the next result written into one is then a copy, and no
        more, where mapping it as it is written costs as much again."""
        if self._mapped and os.getpid() == self._pid:
            for segment in self._kept:
                with contextlib.suppress(OSError):
                    segment.map()

    def trim(self) -> None:
        """Keep none: each kept segment's name goes now (or, one the supervisor
        still has, as it lets go), and its memory with it."""
        kept, self._kept = self._kept, []
        if os.getpid() == self._pid:
            for segment in kept:
                segment.drop()

    def write(self, buffers: list[pickle.PickleBuffer]) -> tuple[str, Spans, int]:
        """Write ``buffers``: the segment's name, where each lies in it, and its token (0: not kept)."""
        if os.getpid() != self._pid:  # a forked copy: the segments are its parent's
            self._kept, self._pid = [], os.getpid()
        spans, pieces, end = shm.layout(buffers, ALIGN)
        for kept in sorted((k for k in self._kept if k.size >= end), key=lambda k: k.size):
            if kept.is_free():
                kept.rewrite(spans, buffers, pieces, self._mapped)
                return kept.name, spans, kept.token
        name = f"{self.prefix}w{os.getpid()}-{next(shm.counter)}"
        token = (int.from_bytes(os.urandom(8), "little") | 1) if end <= KEEP_RESULT_BYTES else 0
        fd = shm.create_segment(name)
        try:
            # (A new segment's pages are written with one pwritev: it allocates them as it goes.)
            shm.write_all(fd, [_HEADER.pack(token, _SENT).ljust(ALIGN, b"\0"), *pieces], 0)
        except BaseException:
            os.close(fd)
            shm.unlink_segment(name)
            raise
        if not token:
            os.close(fd)
        else:
            self._keep(_Kept(fd, name, end, token))
        return name, spans, token

    def _keep(self, new: _Kept) -> None:
        self._kept.append(new)
        while len(self._kept) > KEEP_RESULT_SEGMENTS or sum(k.size for k in self._kept) > KEEP_RESULT_BYTES:
            self._kept.pop(0).drop()  # (the supervisor may still map it: its mapping keeps the pages)


class MappedFrame:
    """A trusted worker's OK message whose result has buffers out of band:
    written to a segment only as it is sent (``write``), so a result refused
    for its size (``max_result_bytes``) leaves nothing behind. ``len`` is
    the result's whole size, buffers included. ``in_band`` makes the message
    with the buffers in the pipe instead, should no segment be written."""

    __slots__ = ("buffers", "data", "in_band", "job_id", "segments")

    def __init__(
        self,
        job_id: int,
        data: bytes,
        buffers: list[pickle.PickleBuffer],
        segments: ResultSegments,
        in_band: Callable[[], Any],
    ) -> None:
        self.job_id = job_id
        self.data = data
        self.buffers = buffers
        self.segments = segments
        self.in_band = in_band

    def __len__(self) -> int:
        return len(self.data) + sum(buffer.raw().nbytes for buffer in self.buffers)

    def write(self, trailer: Callable[[int], bytes]) -> Any:
        """Write the segment; the message that names it (``trailer(job_id)``
        after it). If no segment can be written (no room in SHM_DIR), the
        message ``in_band`` makes."""
        try:
            name, spans, token = self.segments.write(self.buffers)
        except OSError:
            self.buffers = []
            return self.in_band()
        self.buffers = []
        return pickle.dumps((name, spans, token, self.data), 5) + trailer(self.job_id)


def map_result(name: str, spans: Spans, token: int) -> list[memoryview]:
    """Map result segment ``name`` copy-on-write; a view of each buffer in
    it. A kept segment (``token``) is given back to its worker as the
    mapping goes; one not kept, or dropped from the keep already, has its
    name removed at once."""
    path = os.path.join(shm.SHM_DIR, name)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        kept = False
        if token:
            fcntl.flock(fd, fcntl.LOCK_EX)
            header = _HEADER.unpack(os.pread(fd, _HEADER.size, 0))
            if header not in ((token, _SENT), (token, _ORPHAN)):
                raise ValueError(f"shared-memory segment {name} does not hold the result its message names")
            kept = header[1] == _SENT
        if not kept:
            os.unlink(path)
        if token:
            # Let go of the lock now: the mapping keeps a duplicate of ``fd``,
            # which would hold it for as long as the mapping lives.
            fcntl.flock(fd, fcntl.LOCK_UN)
        size = os.fstat(fd).st_size
        mapped = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    if kept:
        weakref.finalize(mapped, _let_go, path, token)
    with memoryview(mapped) as whole:
        if any(offset < ALIGN or offset + length > size for offset, length in spans):
            raise ValueError(f"shared-memory segment {name} is {size} bytes, shorter than its buffers")
        return [whole[offset : offset + length] for offset, length in spans]


def _let_go(path: str, token: int) -> None:
    """Nothing maps the result in segment ``path`` any more: its worker may
    write it again, or, if it dropped it meanwhile, its name goes. (Gone, or
    another's by now: nothing to do.)"""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            header = _HEADER.unpack(os.pread(fd, _HEADER.size, 0))
            if header == (token, _SENT):
                os.pwrite(fd, _HEADER.pack(token, _FREE), 0)
            elif header == (token, _ORPHAN):
                os.unlink(path)
        finally:
            os.close(fd)
