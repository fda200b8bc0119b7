"""An untrusted worker's relay of what a job's process writes: each frame
passed on to the supervisor verbatim and marked as the job's (``Relay``)."""

from __future__ import annotations

import os
import struct

from procq._wire.protocol import CUT_SHORT, FROM_JOB, frame_header

__all__ = ["RELAY_CHUNK", "Relay", "write_all"]

#: How much of a job's channel is read (and relayed) at once.
RELAY_CHUNK = 1 << 16


class Relay:
    """Copies the job process's frames to the supervisor as they arrive, the
    body verbatim, and marks each as the job's: a length prefix one byte
    longer, and ``FROM_JOB`` after the body (see ``_wire.protocol``). It reads
    nothing but the length prefixes; checking what the frames hold is the
    supervisor's work.

    A length prefix no frame can have (negative) is passed on as it is, for
    the supervisor to refuse; nothing after it is relayed.
    """

    __slots__ = ("_broken", "_fd", "_head", "_left")

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._head = bytearray()  # the length prefix being read
        self._left: int | None = None  # bytes of the current body still to come
        self._broken = False

    def feed(self, data: bytes) -> None:
        out: list[bytes | memoryview] = []
        view = memoryview(data)
        while view and not self._broken:
            left = self._left
            if left is not None:
                part = view[:left]
                out.append(part)
                view = view[len(part) :]
                self._left = left - len(part)
                if self._left == 0:
                    out.append(FROM_JOB)
                    self._left = None
                continue
            head = self._head
            want = 12 if len(head) >= 4 and head[:4] == b"\xff\xff\xff\xff" else 4
            part = view[: want - len(head)]
            head += part
            view = view[len(part) :]
            if len(head) < want:
                continue
            (size,) = struct.unpack("!i", head[:4])
            if size == -1:
                if len(head) < 12:
                    continue
                (size,) = struct.unpack("!Q", head[4:12])
            elif size < 0:
                out.append(bytes(head))
                self._broken = True
                break
            head.clear()
            out.append(frame_header(size + 1))
            if size:
                self._left = size
            else:
                out.append(FROM_JOB)
        if out:
            write_all(self._fd, b"".join(out))

    def finish(self) -> None:
        """The job's process has exited: complete a frame it left unfinished
        (zeros, then ``CUT_SHORT``), so the worker's own frame that follows is
        read as one."""
        if self._broken:
            return
        if self._head:
            self._head.clear()
            write_all(self._fd, frame_header(1) + CUT_SHORT)
        elif self._left is not None:
            zeros = bytes(min(self._left, RELAY_CHUNK))
            while self._left:
                n = min(self._left, len(zeros))
                write_all(self._fd, zeros[:n])
                self._left -= n
            write_all(self._fd, CUT_SHORT)
            self._left = None


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
