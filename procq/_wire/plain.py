"""What unpickles without running code, and how to tell.

Unpickling calls something (a class, a function: its ``__reduce__``,
``__setstate__``, ``__new__``) only through an opcode that names it first:
``GLOBAL``, ``INST``, ``STACK_GLOBAL`` or ``EXT1/2/4``. A pickle without one
is plain data, and unpickling it runs no code of anyone's. ``names_nothing``
tells from the bytes alone (erring on the safe side); ``DataOnly`` is an
unpickler that refuses to name anything, so it decodes plain data and gives
up (``NeedsCode``) on the rest. A trusted worker checks each result it
pickles (``result_frame``), so the supervisor's I/O thread unpickles results
tagged plain, and leaves the others to a decode thread (``_supervisor.channel_trusted``).
"""

from __future__ import annotations

import builtins
import io
import os
import pickle
import re
import struct
from collections.abc import Callable
from typing import Any

from procq._wire.oob import dumps_oob
from procq._wire.protocol import OK, OK_MAPPED, OK_OBJECTS, TRAILER, dumps, dumps_fn
from procq._wire.shm_results import MappedFrame, ResultSegments

__all__ = [
    "BuiltinExceptions",
    "DataOnly",
    "NeedsCode",
    "Parts",
    "load_data",
    "mapped_trailer",
    "names_nothing",
    "result_frame",
    "send_frame",
    "send_message",
]

#: Results larger than this are not checked in the worker: the supervisor
#: leaves them to a decode thread anyway (``_supervisor.channel_trusted.INLINE_DECODE_BYTES``).
CHECKED_BYTES = 1 << 24

#: Pickle opcodes that name a class or function: EXT1, EXT2, EXT4 and
#: STACK_GLOBAL, and the text ones, GLOBAL and INST, which read the names that
#: follow them as two lines (so in data with fewer than two newlines they fail
#: before naming anything). Every opcode that calls something (REDUCE, BUILD,
#: NEWOBJ, ...) needs a class or function named first.
_NAMING_OPCODES = (b"\x82", b"\x83", b"\x84", b"\x93")
_TEXT_NAMING_OPCODES = (b"c", b"i")
_NAMING_SEARCH = re.compile(rb"[\x82\x83\x84\x93]").search
_TEXT_NAMING_SEARCH = re.compile(rb"[ci]").search
#: Below this size one regular-expression search (a single C call) beats a
#: memchr per opcode byte, whose Python-level loop costs more than the scan:
#: most results of small jobs are a few bytes.
_SMALL = 64


def names_nothing(data: bytes | bytearray) -> bool:
    """True when unpickling ``data`` cannot call anything: none of the bytes of
    an opcode that names a class or function are in it. (It errs on the safe
    side: such a byte inside a string or a number counts too.) One memchr per
    opcode byte: gigabytes a second, where a regular expression's character
    class scans at a few tens of megabytes (but wins on a few bytes)."""
    if len(data) < _SMALL:
        if _NAMING_SEARCH(data) is not None:
            return False
        return data.count(b"\n") < 2 or _TEXT_NAMING_SEARCH(data) is None
    for op in _NAMING_OPCODES:
        if op in data:
            return False
    return not any(op in data for op in _TEXT_NAMING_OPCODES) or data.count(b"\n") < 2


class NeedsCode(Exception):
    """Unpickling this would call something."""


class DataOnly(pickle.Unpickler):
    """Unpickles plain data only: naming any class or function is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise NeedsCode


class BuiltinExceptions(pickle.Unpickler):
    """Unpickles plain data and the built-in exception types (made and set up
    by C code alone: ``BaseException.__new__`` and ``__setstate__``)."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins":
            found = getattr(builtins, name, None)
            if isinstance(found, type) and issubclass(found, BaseException):
                return found
        raise NeedsCode


def load_data(data: bytes | bytearray, unpickler: type[pickle.Unpickler] = DataOnly) -> Any:
    """Unpickle ``data`` (a pickle, maybe followed by a trailer) if that runs
    no code; raises ``NeedsCode`` if it would. (The trailer is checked too:
    a pickle cut short would read on into it.)"""
    if names_nothing(data):
        return pickle.loads(data)
    return unpickler(io.BytesIO(data)).load()


def result_frame(job_id: int, result: Any, segments: ResultSegments | None = None) -> bytes | Parts | MappedFrame:
    """A trusted worker's OK message: the result pickled once, then the
    trailer, whose tag says whether unpickling it may run code (``OK_OBJECTS``).
    A pickle the byte scan cannot clear (a number or a string may hold such a
    byte) is tried with ``DataOnly`` here, in the worker, so plain data is
    never sent to a decode thread for nothing. A result with large buffers
    sends them through a shared-memory segment of ``segments``
    (``MappedFrame``: always decoded by a decode thread); with no
    ``segments``, in the pipe."""
    if segments is None:
        data = dumps(result)
    else:
        data, buffers = dumps_oob(result, dumps_fn)
        if buffers:
            return MappedFrame(job_id, data, buffers, segments, lambda: result_frame(job_id, result))
    plain = names_nothing(data)
    if not plain and len(data) <= CHECKED_BYTES:
        try:
            DataOnly(io.BytesIO(data)).load()
            plain = True
        except Exception:  # NeedsCode, or anything else: the supervisor's decode thread will see
            pass
    trailer = TRAILER.pack(job_id, OK if plain else OK_OBJECTS)
    if len(data) < SPLIT_BYTES:
        return data + trailer
    return Parts(data, trailer)


def mapped_trailer(job_id: int) -> bytes:
    """The trailer of a ``MappedFrame``'s message."""
    return TRAILER.pack(job_id, OK_MAPPED)


def send_message(fd: int, send_bytes: Callable[[bytes], None], frame: bytes | Parts | MappedFrame) -> None:
    """Send one of a trusted worker's messages on ``fd`` (``send_bytes``: its
    connection's): a ``MappedFrame``'s segment is written first (or, with no
    room for one, its message made in band)."""
    out: bytes | Parts = frame.write(mapped_trailer) if isinstance(frame, MappedFrame) else frame
    if isinstance(out, Parts):
        send_frame(fd, out)
    else:
        send_bytes(out)


#: From this size on a result's pickle and its trailer are written with one
#: vectored write instead of being joined: joining copies the whole pickle
#: into a fresh buffer of its size (page faults and all), a fifth of the time
#: a large result takes.
SPLIT_BYTES = 1 << 16


class Parts:
    """A frame in two pieces, the pickle and the trailer (see ``send_frame``);
    ``len`` is the frame's, as for ``bytes``."""

    __slots__ = ("data", "trailer")

    def __init__(self, data: bytes, trailer: bytes) -> None:
        self.data = data
        self.trailer = trailer

    def __len__(self) -> int:
        return len(self.data) + len(self.trailer)


def send_frame(fd: int, parts: Parts) -> None:
    """Write ``parts`` on ``fd`` as one ``Connection.send_bytes`` frame (its
    length prefix, then the bytes), without joining them."""
    size = len(parts)
    header = struct.pack("!i", size) if size <= 0x7FFFFFFF else struct.pack("!iQ", -1, size)
    pending: list[Any] = [header, memoryview(parts.data), parts.trailer]
    while pending:
        sent = os.writev(fd, pending)
        while pending and sent >= len(pending[0]):
            sent -= len(pending[0])
            pending.pop(0)
        if pending and sent:
            pending[0] = memoryview(pending[0])[sent:]
