"""What an untrusted lane's workers and jobs print, relayed by the supervisor.

An untrusted worker (and so every job it forks) never holds the supervisor's
own stdout and stderr: in a terminal those are the terminal itself, opened
read and write, and a job holding one could read what the user types next
or change the terminal's modes (``tcsetattr`` works on any descriptor of
it). Its stdout and stderr are instead the write ends of two pipes, whose
read ends a thread of the lane's (``OutputRelay``) reads and copies to the
supervisor's descriptors 1 and 2, as they are when the bytes arrive.

Bounded: a chunk read is written whole before the next is read, so what a
job prints waits in its pipe (the kernel's 64 KiB), never in the
supervisor's memory, and a job that prints without end only runs as fast as
the supervisor's stdout takes it. The I/O thread never writes any of it: a
terminal that stops taking output stalls the jobs that print, not the queue.
In order per stream: each pipe is read by one thread and written out in the
order read; what one job writes to stdout and to stderr may interleave
otherwise than it would in a terminal. What a job prints may appear a moment
after its result is delivered; all of it has been written by the time the
queue's ``close()`` returns (but for what a process the job left behind
holds back: a stream is closed a second after its worker is reaped).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import selectors
import threading
import time

__all__ = ["OutputRelay", "Stream"]

#: How much of one pipe is read, and written out, at once.
CHUNK = 1 << 16
#: How long a dead worker's pipes are read on for what its leftovers write.
ENDING_GRACE = 1.0
#: How long ``close`` waits for the lane's pipes to reach their end.
CLOSE_WAIT = 5.0
#: At most how many chunks a pipe still holds are relayed once its time is up.
_LAST_CHUNKS = 16


class Stream:
    """One pipe's read end, relayed to the supervisor's descriptor ``target``."""

    __slots__ = ("broken", "deadline", "fd", "target")

    def __init__(self, fd: int, target: int) -> None:
        self.fd = fd
        self.target = target
        self.deadline: float | None = None  # once its worker is reaped: closed by then at the latest
        self.broken = False  # the target refused a write: what comes next is read and dropped


class OutputRelay:
    """The relay of one lane's pipes (see the module docstring). ``open``
    and ``release`` may be called from any thread; the relay's own thread
    is started with the first stream and stopped by ``close``."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._added: list[Stream] = []  # opened, for the thread to register
        self._streams: dict[int, Stream] = {}  # the thread's own
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread: threading.Thread | None = None
        self._closing = False

    def open(self, target: int) -> tuple[int, Stream]:
        """A new pipe relayed to ``target`` (1 or 2): its write end, for the
        worker (the caller closes it once the worker holds it), and its stream."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        stream = Stream(read_fd, target)
        with self._lock:
            if self._closing:
                os.close(read_fd)
                os.close(write_fd)
                raise RuntimeError(f"lane {self._name!r} is closing: its output relay takes no new worker")
            self._added.append(stream)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"procq-output-{self._name}", daemon=True)
                self._thread.start()
        self._wake()
        return write_fd, stream

    def release(self, streams: list[Stream]) -> None:
        """Their worker is reaped: each is read to its end, and closed at the
        latest ``ENDING_GRACE`` seconds from now (a process it left behind may hold it open)."""
        deadline = time.monotonic() + ENDING_GRACE
        for stream in streams:
            stream.deadline = deadline
        self._wake()

    def close(self, timeout: float = CLOSE_WAIT) -> None:
        """Every worker of the lane is reaped: relay what is left in their
        pipes (waiting up to ``timeout`` for them to end), then stop."""
        with self._lock:
            self._closing = True
            thread = self._thread
            streams = list(self._added) + list(self._streams.values())
        deadline = time.monotonic() + timeout
        for stream in streams:
            if stream.deadline is None or stream.deadline > deadline:
                stream.deadline = deadline
        self._wake()
        if thread is not None:
            # Not past the deadline by much: a thread still writing then is
            # held by a stdout that takes nothing (a stopped terminal); it is
            # left to finish on its own (a daemon), with its pipes.
            thread.join(timeout + 1.0)
            if thread.is_alive():
                return
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full: it is woken already
            os.write(self._wake_w, b"\0")

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake_r, selectors.EVENT_READ)
            while True:
                with self._lock:
                    added, self._added = self._added, []
                    stop = self._closing and not self._streams and not added
                for stream in added:
                    self._streams[stream.fd] = stream
                    selector.register(stream.fd, selectors.EVENT_READ, stream)
                if stop:
                    return
                deadlines = [s.deadline for s in self._streams.values() if s.deadline is not None]
                timeout = None if not deadlines else max(0.0, min(deadlines) - time.monotonic())
                for key, _ in selector.select(timeout):
                    if key.data is None:
                        with contextlib.suppress(OSError):
                            os.read(self._wake_r, 4096)
                    else:
                        self._relay(selector, key.data)
                now = time.monotonic()
                for stream in [s for s in self._streams.values() if s.deadline is not None and s.deadline <= now]:
                    for _ in range(_LAST_CHUNKS):  # what is in it now, then no more
                        if stream.fd not in self._streams or not self._relay(selector, stream):
                            break
                    if stream.fd in self._streams:
                        self._end(selector, stream)

    def _relay(self, selector: selectors.BaseSelector, stream: Stream) -> bool:
        """Relay one chunk of ``stream``; False if it had none (empty, or at its end: then ended)."""
        try:
            chunk = os.read(stream.fd, CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self._end(selector, stream)
            return False
        if not stream.broken:
            stream.broken = not _write_all(stream.target, chunk)
        return True

    def _end(self, selector: selectors.BaseSelector, stream: Stream) -> None:
        selector.unregister(stream.fd)
        del self._streams[stream.fd]
        os.close(stream.fd)


def _write_all(fd: int, data: bytes) -> bool:
    """Write ``data`` whole to ``fd`` (waiting while a non-blocking one is
    full); False if it refused (closed, a broken pipe): nothing more goes there."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            select.select([], [fd], [], 1.0)
        except InterruptedError:
            continue
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            return False
    return True
