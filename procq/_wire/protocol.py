"""What travels on a worker's pipe, how it is framed, and what it decodes to.

Each worker has its own duplex ``multiprocessing`` pipe; nothing is shared
between workers. Every message is one ``send_bytes`` frame. The job's function
and arguments travel inside it as separate, already-pickled ``bytes``, so a
payload that fails to unpickle on the far side fails only that job and never
hides which job it belonged to.

Supervisor -> worker, both kinds of lane (pickled tuples)::

    (RUN, job_id, fn_id, fn_bytes | None, args_bytes, memory_limit | None)
    (RUN_MANY, [(job_id, fn_id, fn_bytes | None, args_bytes, memory_limit), ...])
                                       trusted lanes: jobs sent ahead, run in order
    (CANCEL, job_id)                   trusted lanes: skip that job if not started

``args_bytes`` of a trusted lane's job whose arguments hold large buffers
pickles to a reference to a shared-memory segment holding them
(``_wire.shm``): the worker maps it as it unpickles the arguments.

``fn_id`` is a digest of ``fn_bytes``. The bytes are sent only the first time
a worker sees that digest; the worker keeps the unpickled function in an LRU of
``FN_CACHE_SIZE`` entries, and the supervisor keeps an exact mirror of that LRU
per worker (:class:`FnMirror`), so both sides always agree on what the worker
holds without ever asking. Because the id is the content, a closure whose
captured values changed since its last push is simply a new function.

Worker -> supervisor, trusted lanes: a payload, then a fixed 9-byte trailer
(``TRAILER``: the job id, a little-endian int64, and a tag byte)::

    b"" | why, UTF-8                   + (0, READY)       once, when it is set up and takes jobs;
                                                          why it imported the main module
                                                          itself, if it did (``_worker.forkserver_main``)
    pickle(result)                     + (job_id, OK)     the result pickled once; it names no
                                                          class or function (``_wire.plain``)
    pickle(result)                     + (job_id, OK_OBJECTS)  one that does
    pickle((segment, spans, pickle(result)))
                                       + (job_id, OK_MAPPED)  a result whose large buffers
                                                          are in a shared-memory segment,
                                                          mapped by the supervisor (``_wire.shm``)
    pickle((exc_bytes | None, exc_type, message, traceback_text, kind))
                                       + (job_id, ERROR)  exc_bytes: the exception, pickled apart
    b""                                + (job_id, SKIPPED) a CANCEL came before the job started
    names, UTF-8, one a line           + (job_id, IMPORTED) modules unpickling the job imported,
                                                          sent before its report, only by a worker
                                                          of a lane that learns them (``_worker.warm``)

The trailer is read without unpickling anything, so the supervisor always
knows which job a report is for, and a payload that fails to unpickle fails
that job alone. (``pickle.loads`` ignores the bytes after a pickle's end, so
a payload is unpickled in place, with its trailer.) Unpickling may run code
of the result's classes; the I/O thread only unpickles what cannot (no opcode
that names a class or function: the worker checks the pickle it made, in
parallel with the supervisor, and says so in the tag; see ``_wire.plain``) and
leaves the rest ``Undecoded`` for the lane's decode thread (see ``_supervisor.channel_trusted``).

A trusted worker reports its jobs in the order it was sent them, one message
each, so the supervisor always knows which one it is running: the first it
has sent and not heard back about. Each becomes ``Ready`` or a ``Report``
(see ``_supervisor.channel_trusted``).

Worker -> supervisor, untrusted lanes (UTF-8 JSON arrays, never unpickled).
An untrusted lane's worker runs no job code: it forks a process for each job
and relays that process's frames to the supervisor. The last byte of every
frame says who wrote the rest (see ``FROM_WORKER``, ``FROM_JOB``, ``CUT_SHORT``)::

    ["ready"]                                       + b"w"  once, from the worker
    ["ok", job_id, output]                          + b"j"  from the job's process
    ["error", job_id, kind, exc_type, message, tb]  + b"j"  from the job's process
    ["exit", job_id, returncode]                    + b"w"  from the worker, once the
                                                            job's process has exited
    ["exit", job_id, returncode, "memory"]          + b"w"  the same, when the kernel
                                                            killed it for its sandbox's
                                                            memory bound (its cgroup)

The worker copies the job's bytes as they arrive; it only reads each frame's
length prefix, to write its own (one byte longer) and the trailer after the
body. A job's process therefore cannot write a frame that looks like the
worker's, and the supervisor knows a job has ended only from the worker. A job
whose process stops in the middle of a frame has the rest of it filled with
zeros by the worker and the trailer ``CUT_SHORT``.

An untrusted worker's messages are read by ``FrameReader`` (never blocking on
a partial frame, refusing a length past the lane's limit before reading the
body) and checked by ``decode_untrusted``, which gives ``Ready``,
``JobOutput``, ``JobError`` or ``JobExit``; anything else is a protocol
violation that fails the worker's job. ``kind`` is ``"error"``, ``"memory"``
(the job raised ``MemoryError``) or ``"protocol"`` (its result was too large).
``returncode`` is the job process's exit status as ``subprocess`` gives it
(negative: killed by that signal).

A worker that dies sends nothing: the supervisor learns of it from the
process sentinel, and knows which job it held because it gave it that job.

What a worker channel reads comes out as events (``Event``): ``Ready``, a
``Report`` of a job's end (settled by ``Core.jobs_done``, which answers with
a ``Reported``), or a ``Violation`` of the protocol. A report's outcome may be
``Undecoded``: the job has ended and its worker moves on, and the lane's
decode thread turns it into the job's outcome (``Core.decoded``).
"""

from __future__ import annotations

import json
import math
import os
import pickle
import select
import socket
import struct
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

from procq._model.values import Completed, Failed, FailureKind
from procq._wire.main_by_value import MAIN

try:
    # hashlib's blake2b, without hashlib: importing hashlib loads OpenSSL's
    # libcrypto, and every worker forked from the forkserver (which preloads
    # this module) would carry its mappings, at a cost in each fork and exit.
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - a Python built without _blake2
    from hashlib import blake2b

__all__ = [
    "CANCEL",
    "CUT_SHORT",
    "ERROR",
    "FN_CACHE_SIZE",
    "FROM_JOB",
    "FROM_WORKER",
    "IMPORTED",
    "OK",
    "OK_MAPPED",
    "OK_OBJECTS",
    "READY",
    "RUN",
    "RUN_MANY",
    "SKIPPED",
    "TRAILER",
    "DecodeLater",
    "Event",
    "FnMirror",
    "FrameReader",
    "JobError",
    "JobExit",
    "JobOutput",
    "ProtocolError",
    "Ready",
    "Report",
    "Undecoded",
    "Violation",
    "blake2b",
    "decode_untrusted",
    "digest",
    "dumps",
    "dumps_fn",
    "frame_header",
    "json_dumps",
    "pickled_by_reference",
]

RUN = 0
OK = 1
ERROR = 2
READY = 3
OK_OBJECTS = 4  # an OK whose pickle names a class or function: unpickling it may run code
RUN_MANY = 5
CANCEL = 6
SKIPPED = 7
OK_MAPPED = 8  # an OK whose result's large buffers are in a shared-memory segment (``_wire.shm``)
IMPORTED = 9  # modules a job's unpickling imported (a lane that learns them: ``_worker.warm``)

#: The last byte of an untrusted worker's frame: who wrote the rest of it.
FROM_WORKER = b"w"
FROM_JOB = b"j"
#: A frame of the job's that its process never finished; the rest is zeros.
CUT_SHORT = b"t"

#: How many distinct functions a worker keeps unpickled.
FN_CACHE_SIZE = 128

#: What ends every trusted worker's message: the job id and the tag.
TRAILER = struct.Struct("<qB")

PROTOCOL = pickle.HIGHEST_PROTOCOL

# --- what a worker channel reads ----------------------------------------------


class Ready(NamedTuple):
    """The worker is set up and takes jobs (its first message, sent once)."""


class Undecoded:
    """A job's outcome the I/O thread leaves as it came: decoding it may run
    code of the job's own classes (unpickling), or cost more than the I/O
    thread may spend while other lanes wait. A lane's decode thread calls
    ``decode``, which never raises: what fails to decode fails the job."""

    __slots__ = ()

    def decode(self) -> Completed[Any] | Failed:
        raise NotImplementedError


class Report(NamedTuple):
    """The end of a job as its worker reported it, for ``Core.jobs_done``."""

    job_id: int
    outcome: Completed[Any] | Failed | Undecoded
    retire: bool  # the worker must be replaced after this job
    crashed: bool  # the outcome is a crash of the job's own process (counted in the lane's stats)


class Violation(NamedTuple):
    """The worker broke the protocol; ``what`` completes "broke procq's protocol with ..."."""

    what: str


class DecodeLater(NamedTuple):
    """A message the channel will not decode on the I/O thread (it may cost
    much). ``decode`` runs on the lane's decode thread and never raises; what
    it returns goes back to the channel on the I/O thread
    (``WorkerChannel.resume``), which reads nothing more of that worker's
    messages until then, so they are still checked in order."""

    decode: Callable[[], Any]


Event = Ready | Report | Violation | DecodeLater


def dumps(obj: Any, main_by_value: bool = False) -> bytes:
    """Pickle ``obj`` for the other side of a worker pipe: the standard pickler
    first (several times faster on plain data), cloudpickle for what it cannot
    do (lambdas, closures, local classes) and, with ``main_by_value``, for a
    pickle that names the main module (``_wire.main_by_value``). Raises what
    cloudpickle raises when neither can pickle ``obj``."""
    try:
        data = pickle.dumps(obj, PROTOCOL)
    except Exception:
        return dumps_fn(obj)
    return dumps_fn(obj) if main_by_value and MAIN in data else data


def digest(data: bytes) -> bytes:
    """The id of a pickled function: equal bytes, equal id."""
    return blake2b(data, digest_size=16).digest()


def pickled_by_reference(fn: Any) -> bool:
    """True when cloudpickle pickles ``fn`` as a reference to an importable,
    module-level function, so its pickle never changes and can be kept.

    Anything else (lambdas, closures, local functions, ``__main__``'s
    functions, modules registered for pickling by value) is pickled by value:
    its bytes capture current values and must be made again at every push.
    """
    module_name = getattr(fn, "__module__", None)
    if not module_name or module_name == "__main__":
        return False
    import cloudpickle

    by_value = getattr(cloudpickle.cloudpickle, "_PICKLE_BY_VALUE_MODULES", ())
    if module_name in by_value or module_name.split(".")[0] in by_value:
        return False
    obj: Any = sys.modules.get(module_name)
    for part in getattr(fn, "__qualname__", "<locals>").split("."):
        if obj is None or part == "<locals>":
            return False
        obj = getattr(obj, part, None)
    return obj is fn


def dumps_fn(fn: Any, buffer_callback: Callable[[pickle.PickleBuffer], Any] | None = None) -> bytes:
    """Pickle with cloudpickle, which sends lambdas and closures by value.

    Imported here, not at module level, so that a worker that never needs it
    (most results are plain data) starts without it.
    """
    import cloudpickle

    data: bytes = cloudpickle.dumps(fn, PROTOCOL, buffer_callback=buffer_callback)
    return data


class FnMirror:
    """An LRU of function ids, kept identically by a worker and by the supervisor.

    ``touch(fn_id)`` returns True when the id was already held (so its bytes
    need not be sent) and records the use; both sides call it once per job, in
    the same order, so their LRUs never diverge.
    """

    __slots__ = ("_held", "_size")

    def __init__(self, size: int = FN_CACHE_SIZE) -> None:
        self._held: OrderedDict[bytes, Any] = OrderedDict()
        self._size = size

    def touch(self, fn_id: bytes, value: Any = None) -> bool:
        held = self._held
        if fn_id in held:
            held.move_to_end(fn_id)
            if value is not None:  # (a worker replacing a stand-in with the function)
                held[fn_id] = value
            return True
        held[fn_id] = value
        if len(held) > self._size:
            held.popitem(last=False)
        return False

    def get(self, fn_id: bytes) -> Any:
        return self._held[fn_id]


# --- untrusted lanes ----------------------------------------------------------

#: The kinds an untrusted worker may give a failed job.
WORKER_KINDS: frozenset[FailureKind] = frozenset({"error", "memory", "protocol"})


class ProtocolError(Exception):
    """A worker's message broke the protocol; the text says how."""


def json_dumps(message: Any) -> bytes:
    """Encode an untrusted worker's message (raises for what JSON cannot hold)."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()


class JobOutput(NamedTuple):
    """An untrusted job's result, as its process sent it (JSON data)."""

    job_id: int
    output: Any


class JobError(NamedTuple):
    """An untrusted job's exception, as its process sent it."""

    job_id: int
    kind: FailureKind  # one of WORKER_KINDS
    exc_type: str
    message: str
    traceback: str


class JobExit(NamedTuple):
    """The process that ran a job exited (from the worker)."""

    job_id: int
    returncode: int
    #: The kernel killed it for its sandbox's memory bound (its memory cgroup).
    memory_killed: bool = False


def decode_untrusted(frame: bytes | bytearray) -> Ready | JobOutput | JobError | JobExit:
    """Check and decode the body of one message from an untrusted worker;
    raises ``ProtocolError`` for anything else. Only ``json`` touches the
    bytes. (Which of these the job's process may send, and which only the
    worker, is the supervisor's to check.)
    """
    try:
        message = json.loads(frame)
    except Exception as exc:  # ValueError, UnicodeDecodeError, RecursionError
        raise ProtocolError(f"a message that is not JSON ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(message, list) or not message or not isinstance(message[0], str):
        raise ProtocolError(f"a message that is not a tagged JSON array: {_preview(frame)}")
    tag = message[0]
    if tag == "ready" and len(message) == 1:
        return Ready()
    if len(message) < 2 or type(message[1]) is not int:
        raise ProtocolError(f"a message without a job id: {_preview(frame)}")
    job_id = message[1]
    if tag == "ok" and len(message) == 3:
        return JobOutput(job_id, message[2])
    if tag == "error" and len(message) == 6 and all(isinstance(field, str) for field in message[2:]):
        if message[2] not in WORKER_KINDS:
            raise ProtocolError(f"an error message with an unknown kind {message[2][:50]!r}")
        return JobError(job_id, *message[2:])
    if tag == "exit" and len(message) == 3 and type(message[2]) is int:
        return JobExit(job_id, message[2])
    if tag == "exit" and len(message) == 4 and type(message[2]) is int and message[3] == "memory":
        return JobExit(job_id, message[2], True)
    raise ProtocolError(f"a malformed message: {_preview(frame)}")


def _preview(frame: bytes | bytearray) -> str:
    return repr(frame[:80]) + ("..." if len(frame) > 80 else "")


class FrameReader:
    """Reads ``multiprocessing.Connection`` frames from a worker's socket:
    whatever has arrived is taken in one read, and every frame completed by
    it is handed over at once, so the supervisor wakes once for many results.
    A frame announced larger than ``limit`` is refused from its length prefix
    alone, before its body is read. Sizes are counted (and reported) without
    the ``trailer`` bytes every frame ends with (see ``FROM_WORKER``).

    Untrusted workers are read without ever blocking: ``Connection.recv_bytes``
    blocks until a frame is complete, so a worker that wrote half a frame and
    stopped would stall the supervisor's I/O thread, and every lane with it.
    A trusted worker writes each frame whole; with ``wait_whole`` the rest of
    a large frame is read at once, straight into the buffer it is unpickled
    from (one copy, as the pipe forces, and no wake-up per piece of it).
    """

    __slots__ = ("_buffer", "_limit", "_poll", "_sock", "_trailer", "_wait_whole", "_what")

    #: Bytes asked for per read (below malloc's mmap threshold: cheap to allocate).
    CHUNK = 1 << 16

    def __init__(self, fd: int, limit: int, what: str = "", wait_whole: bool = False, trailer: int = 0) -> None:
        # A duplicate of the descriptor, read with MSG_DONTWAIT: the original
        # stays blocking for the senders that share it.
        self._sock = socket.socket(fileno=os.dup(fd))
        self._poll: select.poll | None = None  # made by the first ``wait``
        self._limit = limit
        self._what = what or f"the limit of {limit}"
        self._wait_whole = wait_whole
        self._trailer = trailer
        self._buffer = b""

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for something to read (or EOF)."""
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self._sock.fileno(), select.POLLIN)
        return bool(self._poll.poll(math.ceil(timeout * 1000)))

    def read(self) -> list[bytes | bytearray]:
        """The frames completed by what has arrived. Raises ``EOFError`` at
        end of stream and ``ProtocolError`` for a frame past the limit."""
        sock = self._sock
        try:
            data = sock.recv(self.CHUNK, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError as exc:
            raise EOFError(str(exc)) from None
        if not data:
            raise EOFError("the worker closed its pipe")
        if self._buffer:
            data = self._buffer + data
        frames: list[bytes | bytearray] = []
        pos, end = 0, len(data)
        unpack = struct.unpack_from
        while end - pos >= 4:
            (size,) = unpack("!i", data, pos)
            header = 4
            if size == -1:  # a frame of 2 GiB or more: an 8-byte length follows
                if end - pos < 12:
                    break
                (size,) = unpack("!Q", data, pos + 4)
                header = 12
            elif size < 0:
                raise ProtocolError(f"a message with a negative length ({size})")
            if size - self._trailer > self._limit:
                raise ProtocolError(f"a message of {size - self._trailer} bytes, more than {self._what} allows")
            start = pos + header
            if start + size > end:
                if self._wait_whole:
                    frames.append(self._rest(data[start:], size))
                    pos = end
                break
            frames.append(data[start : start + size])
            pos = start + size
        self._buffer = data[pos:] if pos < end else b""
        return frames

    def _rest(self, head: bytes, size: int) -> bytearray:
        """Read the rest of a frame whose first bytes are ``head`` (blocking)."""
        frame = bytearray(size)
        have = len(head)
        frame[:have] = head
        view = memoryview(frame)
        while have < size:
            try:
                got = self._sock.recv_into(view[have:], size - have)
            except OSError as exc:
                raise EOFError(str(exc)) from None
            if not got:
                raise EOFError("the worker closed its pipe in the middle of a message")
            have += got
        return frame

    def close(self) -> None:
        self._sock.close()


def frame_header(size: int) -> bytes:
    """The length prefix ``Connection.send_bytes`` writes before a body of ``size`` bytes."""
    if size > 0x7FFFFFFF:
        return struct.pack("!iQ", -1, min(size, 2**64 - 1))
    return struct.pack("!i", size)
