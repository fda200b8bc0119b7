"""Large buffers outside the pickle stream, through shared memory: where
the buffers ``_wire.oob`` leaves out of the pickle go, and who frees them.

The buffers of one message go into one *segment*: a file in ``SHM_DIR``
(``/dev/shm``, a tmpfs: memory, never a disk), written with one vectored
write, each buffer at an offset aligned to ``ALIGN`` bytes. What travels on
the pipe is the small pickle that is left, the segment's name and where each
buffer lies in it (``Spans``). The receiver opens the file and maps it
copy-on-write (``MAP_PRIVATE``): a numpy array comes back as a view of that
mapping, writable as an unpickled one is, with no copy (pages are copied
only where the receiver writes to them); ``bytes`` and ``bytearray`` are
copied out of it once, as they own their memory.

Who removes a segment's name, and when (nothing else holds one's memory but
the mappings of it, which go with the objects made from them):

- Arguments: ``procq-<supervisor pid>-a<n>``, made by the pushing thread,
  held by the job until it ends, however it ends (the claim's entry holds the
  ``Segment``; a finalizer gives it back should the entry be dropped
  otherwise), then kept by its queue for a later job (``ArgSegments``: at
  most ``KEEP_SEGMENTS`` and ``KEEP_BYTES``) and removed as the queue
  closes. A worker only maps it, so a retry maps it again.
- Results: ``procq-<supervisor pid>-w<worker pid>-<n>``, made by the worker
  as it sends the result, and kept by it to write a later result into once
  the supervisor is done with it (``_wire.shm_results``). A worker that dies
  or exits: the supervisor removes every name of that worker's as it reaps
  it (``sweep``), when nothing of it can write any more.
- The supervisor killed: its undertaker (``_supervisor.undertaker``) kills
  the workers, waits for them to be gone, and removes every name of that
  supervisor's pid.

Untrusted and remote lanes never use segments: what they send is never
unpickled, and they may not map the supervisor's memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import mmap
import os
import pickle
import struct
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from procq._wire.oob import dumps_in_band, dumps_oob

__all__ = [
    "ALIGN",
    "KEEP_BYTES",
    "KEEP_SEGMENTS",
    "SHM_DIR",
    "ArgSegments",
    "Segment",
    "Spans",
    "counter",
    "create_segment",
    "dumps_args",
    "layout",
    "load_mapped",
    "segment_prefix",
    "sweep",
    "unlink_segment",
    "write_all",
]

#: Where segments live: a tmpfs, so their pages are memory and never touch a disk.
SHM_DIR = "/dev/shm"
#: Each buffer starts at a multiple of this in its segment: any dtype's
#: alignment, and a cache line.
ALIGN = 64
#: Bytes written per call: Linux writes at most 2 GiB less a page per write.
_MAX_WRITE = 0x7FFFF000
_PADDING = bytes(ALIGN)
#: At most this many argument segments, and this many bytes of them, are kept for reuse per queue.
KEEP_SEGMENTS = 4
KEEP_BYTES = 1 << 30
#: The first bytes of an argument segment: the generation of what it holds (0: being written).
_GENERATION = struct.Struct("<Q")
counter = itertools.count()

#: Where each buffer lies in its segment: (offset, length) pairs.
Spans = list[tuple[int, int]]


def segment_prefix(pid: int | None = None) -> str:
    """The start of every segment name a supervisor's queues use (its pid)."""
    return f"procq-{os.getpid() if pid is None else pid}-"


def create_segment(name: str) -> int:
    """Create segment ``name``, open for writing."""
    path = os.path.join(SHM_DIR, name)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o600)
    except FileExistsError:
        # Left by a process that had this pid before and was killed: the pid
        # is ours now, so nothing of that process can be using it.
        _unlink(path)
        return os.open(path, flags, 0o600)


def layout(buffers: list[pickle.PickleBuffer], start: int) -> tuple[Spans, list[Any], int]:
    """Where each buffer goes from ``start`` on (each aligned to ``ALIGN``),
    the pieces to write there (padding included), and where they end."""
    spans: Spans = []
    pieces: list[Any] = []
    offset = start
    for buffer in buffers:
        raw = buffer.raw()
        pad = -offset % ALIGN
        if pad:
            pieces.append(_PADDING[:pad])
            offset += pad
        spans.append((offset, raw.nbytes))
        if raw.nbytes:
            pieces.append(raw)
        offset += raw.nbytes
    return spans, pieces, offset


def write_all(fd: int, pieces: list[Any], offset: int) -> None:
    """One ``pwritev`` for all the pieces, from ``offset`` on (more only past the kernel's limit per call)."""
    pending = [memoryview(piece).cast("B") for piece in pieces]
    while pending:
        batch: list[memoryview] = []
        size = 0
        for piece in pending:
            if size + len(piece) > _MAX_WRITE and batch:
                break
            batch.append(piece)
            size += len(piece)
        written = os.pwritev(fd, batch, offset)
        if written <= 0:
            raise OSError(f"could not write a shared-memory segment (wrote {written} bytes)")
        offset += written
        while pending and written >= len(pending[0]):
            written -= len(pending[0])
            pending.pop(0)
        if pending and written:
            pending[0] = pending[0][written:]


def load_mapped(name: str, generation: int, spans: Spans, data: bytes) -> Any:
    """Unpickle ``data`` with its out-of-band buffers from argument segment
    ``name`` (see ``ArgSegments``), which must still hold ``generation``:
    what a job's arguments that went through shared memory unpickle to, in
    the worker. The segment is locked shared for as long as anything maps it,
    so its owner never writes it anew meanwhile."""
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # (waits while the supervisor writes it)
        if os.pread(fd, _GENERATION.size, 0) != _GENERATION.pack(generation):
            raise RuntimeError(
                f"the job's arguments in shared-memory segment {name} were replaced: the job "
                "ended (cancelled) before this worker started it"
            )
        size = os.fstat(fd).st_size
        mapped = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise
    weakref.finalize(mapped, os.close, fd)  # the lock goes with the last view of the mapping
    whole = memoryview(mapped)
    if any(offset + length > size for offset, length in spans):
        raise ValueError(f"shared-memory segment {name} is {size} bytes, shorter than its buffers")
    return pickle.loads(data, buffers=[whole[offset : offset + length] for offset, length in spans])


class _File:
    """An argument segment the supervisor holds open: its name, size, and the
    generation of what it holds now (written in its first bytes)."""

    __slots__ = ("fd", "generation", "mapped", "name", "pid", "size")

    def __init__(self, name: str, size: int) -> None:
        self.fd = create_segment(name)
        self.name = name
        self.size = size
        self.generation = 0
        self.pid = os.getpid()
        self.mapped: mmap.mmap | None = None  # mapped as it is first written again

    def write(self, spans: Spans, buffers: list[pickle.PickleBuffer], pieces: list[Any]) -> None:
        """Write the buffers where ``spans`` say (``pieces``: the same with padding, from ``ALIGN`` on).

        A new segment is written with one ``pwritev`` (the kernel allocates
        its pages as it goes); one written before, through a mapping kept
        from then on, with numpy's copy, which lets go of the GIL (a copy of
        hundreds of MB must not stall the I/O thread): its pages are mapped
        already, so the copy runs at memory speed, where ``pwritev`` walks
        the file's pages one by one."""
        np = sys.modules.get("numpy")  # (only if the program uses it: never imported for this)
        if self.generation == 1 or np is None:
            write_all(self.fd, pieces, ALIGN)
            return
        if self.mapped is None:
            self.mapped = mmap.mmap(self.fd, self.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        for (offset, length), buffer in zip(spans, buffers, strict=True):
            if length:
                target = np.frombuffer(self.mapped, np.uint8, length, offset)
                np.copyto(target, np.frombuffer(buffer.raw(), np.uint8))
                del target

    def destroy(self) -> None:
        if os.getpid() != self.pid:
            return  # a forked child's copy, at its exit: the segment is its parent's
        _unlink(os.path.join(SHM_DIR, self.name))
        with contextlib.suppress(OSError, BufferError):
            if self.mapped is not None:
                self.mapped.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


class ArgSegments:
    """A queue's argument segments: each job whose buffers go out of band
    gets one (``write``), and gives it back as it ends (``Segment.release``).

    A segment given back is kept, up to ``KEEP_SEGMENTS`` of them and
    ``KEEP_BYTES`` in all, and written again for a later job: its pages are
    in memory already, and writing into them runs at memory speed, where a
    new segment's pages are each allocated and zeroed by the kernel first
    (several times slower). It is reused only when no process maps it any
    more: a worker holds a shared ``flock`` on it for as long as anything of
    its arguments is alive (a job may keep them), and the supervisor writes
    only under an exclusive one, taken without waiting (``LOCK_NB``): a
    segment still mapped is passed over. A job sent ahead and cancelled
    before its worker started it would find its segment holding another
    job's buffers: the generation in the segment's first bytes, checked by
    the worker under its lock, refuses that (``load_mapped``).

    ``close`` (the queue's) removes the kept ones; any given back after it
    is removed at once. Thread-safe: pushes run on any thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _idle and _closed; held only for list work and flock tries
        self._idle: list[_File] = []
        self._closed = False
        # Removes the kept ones should the queue never close (collected, or at exit).
        self._finalizer = weakref.finalize(self, _destroy_all, self._idle)

    def write(self, buffers: list[pickle.PickleBuffer]) -> tuple[Segment, Spans]:
        """Write ``buffers`` into a kept segment, or a new one; where each lies in it."""
        spans, pieces, end = layout(buffers, ALIGN)
        file = self._take(end)
        if file is None:
            file = _File(f"{segment_prefix()}a{next(counter)}", end)
            fcntl.flock(file.fd, fcntl.LOCK_EX)
        try:
            file.generation += 1
            # Generation 0 first: no job's until it is all written.
            os.pwrite(file.fd, _GENERATION.pack(0).ljust(ALIGN, b"\0"), 0)
            file.write(spans, buffers, pieces)
            os.pwrite(file.fd, _GENERATION.pack(file.generation), 0)
        except BaseException:
            file.destroy()
            raise
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(file.fd, fcntl.LOCK_UN)
        return Segment(self, file), spans

    def _take(self, size: int) -> _File | None:
        """A kept segment of at least ``size`` bytes that nothing maps, locked exclusively."""
        with self._lock:
            fits = sorted((f for f in self._idle if f.size >= size), key=lambda f: f.size)
            for file in fits:
                try:
                    fcntl.flock(file.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # still mapped by a worker (a job kept its arguments)
                self._idle.remove(file)
                return file
        return None

    def give_back(self, file: _File) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(file)
                self._idle.sort(key=lambda f: -f.size)  # keep the largest
                kept: list[_File] = []
                total = 0
                for f in self._idle:
                    if len(kept) < KEEP_SEGMENTS and total + f.size <= KEEP_BYTES:
                        kept.append(f)
                        total += f.size
                dropped = [f for f in self._idle if f not in kept]
                self._idle[:] = kept
            else:
                dropped = [file]
        for f in dropped:
            f.destroy()

    def close(self) -> None:
        """Remove the kept segments; any given back from now on is removed at once."""
        with self._lock:
            self._closed = True
            idle, self._idle[:] = list(self._idle), []
        _destroy_all(idle)


def _destroy_all(files: list[_File]) -> None:
    for file in files:
        file.destroy()


class Segment:
    """A job's hold on an argument segment: ``release`` gives it back to its
    ``ArgSegments`` (idempotent). Should the holder never call it, it is
    given back when this object is collected, or at exit."""

    __slots__ = ("__weakref__", "_finalizer", "generation", "name", "size")

    def __init__(self, owner: ArgSegments, file: _File) -> None:
        self.name = file.name
        self.size = file.size
        self.generation = file.generation
        self._finalizer = weakref.finalize(self, owner.give_back, file)

    def release(self) -> None:
        self._finalizer()

    def __reduce__(self) -> Any:
        raise TypeError("a shared-memory Segment belongs to the process that made it")


class _MappedArgs:
    """What a job's arguments pickle to when their buffers are in a segment:
    unpickled in the worker, it is the arguments (``load_mapped``)."""

    __slots__ = ("data", "generation", "name", "spans")

    def __init__(self, segment: Segment, spans: Spans, data: bytes) -> None:
        self.name = segment.name
        self.generation = segment.generation
        self.spans = spans
        self.data = data

    def __reduce__(self) -> Any:
        return load_mapped, (self.name, self.generation, self.spans, self.data)


def dumps_args(
    obj: Any, fallback: Callable[..., bytes], segments: ArgSegments, main_by_value: bool = False
) -> tuple[bytes, Segment | None]:
    """A job's ``(args, kwargs)`` pickled for a trusted worker: large buffers
    in a segment of ``segments`` (returned, for the caller to ``release``
    once the job has ended), the rest as ``pickle.loads`` in the worker takes
    it; ``main_by_value`` as for ``_wire.oob.dumps_oob``."""
    data, buffers = dumps_oob(obj, fallback, main_by_value)
    if not buffers:
        return data, None
    try:
        segment, spans = segments.write(buffers)
    except OSError:
        # No room in SHM_DIR (a container's is 64 MiB by default), or none at
        # all: the buffers go in the pipe, as they would without shared memory.
        return dumps_in_band(obj, fallback, main_by_value), None
    return pickle.dumps(_MappedArgs(segment, spans, data), 5), segment


def unlink_segment(name: str) -> None:
    """Remove segment ``name``'s name (gone already: nothing to do)."""
    _unlink(os.path.join(SHM_DIR, name))


def _unlink(path: str) -> None:
    # (Removed already, by a sweep, or SHM_DIR is gone: nothing is left to free.)
    with contextlib.suppress(OSError):
        os.unlink(path)


def sweep(prefix: str) -> int:
    """Remove every segment whose name starts with ``prefix``; how many."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    removed = 0
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed += 1
            except OSError:
                pass
    return removed
