"""Relaying one connection of a job both ways, once the egress proxy has
let it through (``_system.egress_conn`` decides what may pass): what the
far end sends flows back on a thread of its own from the start, what the
job sends on the connection's own thread; every byte counts towards the
job's ``network_bytes``; a connection idle both ways for the idle timeout
ends; and for plain HTTP the end of the one answer ends the connection.
"""

from __future__ import annotations

import contextlib
import mmap
import select
import socket
import threading
import time
from collections.abc import Callable

from procq._system.egress_wire import Answer

__all__ = ["Relay", "shut"]

_FIRST, _CHUNK = 1 << 16, 1 << 20
_QUIET_MS = 50


def shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class Relay:
    """Both ways between a job's connection and the far end.

    ``spend(n)``: count ``n`` more bytes of the job's, False once past its
    ``network_bytes`` (which has ended its connections). ``answer`` is set
    by whoever carries the job's side before a plain HTTP request goes on:
    the way back then ends with that request's answer, and the connection
    with it."""

    def __init__(self, conn: socket.socket, upstream: socket.socket, idle: float, spend: Callable[[int], bool]) -> None:
        self.conn, self.upstream, self.idle, self.spend = conn, upstream, idle, spend
        self.last = time.monotonic()  # either way's last byte
        self.answer: Answer | None = None

    def run(self, send: Callable[[], None]) -> None:
        """Relay until both ways are done: ``send`` carries the job's side on
        this thread (a protocol whose server speaks first, SSH or SMTP, is
        heard before the job says anything)."""
        self.conn.settimeout(self.idle)
        self.upstream.settimeout(self.idle)
        back = threading.Thread(target=self._back, name="procq-egress", daemon=True)
        back.start()
        try:
            send()
        except BaseException:
            shut(self.upstream)  # refused or broken: the way back ends too
            raise
        finally:
            back.join()

    def _back(self) -> None:
        self.pump(self.upstream, self.conn, back=True)
        if self.answer is not None:
            shut(self.upstream)
            shut(self.conn)  # wakes the reading of the job's side

    def read_job(self) -> bytes:
        """The job's next bytes (counted); ``b""`` once it has closed, moved
        its ``network_bytes``, or both ways were idle for the idle timeout."""
        while True:
            try:
                data = self.conn.recv(65536)
            except TimeoutError:
                if time.monotonic() - self.last < self.idle:
                    continue  # the other way is busy
                return b""
            if data and not self.spend(len(data)):
                return b""
            self.last = time.monotonic()
            return data

    def pump(self, src: socket.socket, dst: socket.socket, back: bool = False) -> None:
        """Copy ``src`` to ``dst`` until ``src`` ends (then end ``dst``'s
        writing), the answer has ended (``back``; what follows it is
        dropped), or both ways have been idle for the idle timeout.

        Plain reads and writes of up to 1 MiB once a connection is busy:
        measured here, they move more than ``splice`` through a pipe does,
        with or without reading and writing overlapped (the proxy copies
        nothing then, but the job's reads of the pages it passes on cost the
        job more CPU than the proxy saves), and larger ones no better; a
        second thread writing while this one reads measured worse
        (bench.sandbox_network). The buffer is an anonymous mapping, whose
        pages cost memory only once written, read into 64 KiB at a time
        until a read fills that; then 1 MiB, until nothing comes for 50 ms
        (the burst is over: its pages are given back): a lane's 64
        connections held open cost the supervisor a few MiB, not 2 MiB
        each."""
        buf = mmap.mmap(-1, _CHUNK)
        size = _FIRST
        ready = select.poll()
        ready.register(src, select.POLLIN)
        try:
            while True:
                if size == _CHUNK and not ready.poll(_QUIET_MS):  # quiet: the burst is over
                    buf.madvise(mmap.MADV_DONTNEED)
                    size = _FIRST
                try:
                    n = src.recv_into(buf, size)
                except TimeoutError:
                    if time.monotonic() - self.last < self.idle:
                        continue  # the other way is busy
                    break
                if not n or not self.spend(n):
                    break
                if n == size:
                    size = _CHUNK
                with memoryview(buf) as view:
                    answer = self.answer if back else None
                    if answer is not None:
                        n = answer.take(view[:n])
                    dst.sendall(view[:n])
                self.last = time.monotonic()
                if answer is not None and answer.done:
                    break
        except OSError:
            shut(src)
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            buf.close()
