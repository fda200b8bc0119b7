"""The undertaker: a tiny process that outlives the supervisor by a moment,
to kill what its workers' jobs left behind.

Why it is needed: each worker leads its own session and process group, and a
job's children are in that group. When the supervisor dies (SIGKILL, or
SIGTERM with Python's default handling) its workers die with it
(``PR_SET_PDEATHSIG``, EOF on their pipes), but a process killed that way
cleans up nothing, and a job's plain child (same group, its own process) is
re-parented to init and lives on. Nothing inside the dying supervisor can
help, and nothing inside a worker either: it may be stopped, stuck in native
code, or killed first. So one process per queue that is neither stands by:

- It is told each worker's process group as the worker starts, and to forget
  it before the worker is reaped (a group id is a pid, and could be someone
  else's once the supervisor has reaped it).
- When the supervisor dies, however it dies, it SIGKILLs every group it knows,
  waits (up to 5 s) until their leaders are gone, removes every shared-memory
  segment named after the supervisor's pid (``_wire.shm``: arguments it
  wrote, results its workers wrote), then exits. Not before the leaders are
  gone: a worker still writing a segment would leave it behind. It sees
  the death two ways: a pidfd of the supervisor (readable when its process
  has exited, even if a child forked from it still holds the pipe) and EOF
  on its pipe from the supervisor; it removes segments only when the
  supervisor is gone (EOF alone is also how a closing queue stops it).
- When the queue closes, every worker is reaped and forgotten by the time
  the supervisor stops: there is nothing left for it to do, and the
  supervisor SIGKILLs and reaps it at once (not waiting for its interpreter to
  finish starting up, should the queue live only milliseconds), so it never
  outlives ``close()``.

It is ``python -I -S`` running ``_PROGRAM`` (a few lines: no import of procq,
no site), in a session of its own (a signal to the supervisor's process group,
Ctrl-C in a terminal say, does not reach it), with ``/`` as its directory. It
is started by the I/O thread as it takes the first READY of a worker, before
that worker is sent a job (so before any job can run), in one ``fork``/``exec``
(about half a millisecond). Not sooner: its interpreter's start would compete
for the CPU with the queue's first workers as they boot. What it is told
before it runs waits in its pipe.

Messages are lines: ``+<pgid>`` (watch) and ``-<pgid>`` (forget).
Each is written whole in one ``write`` to a non-blocking pipe (under
``PIPE_BUF``, so never split): should the undertaker be stopped and its pipe
fill up (thousands of worker starts), a message is dropped rather than stall
the I/O thread.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

from procq._wire.shm import SHM_DIR, segment_prefix

__all__ = ["Undertaker"]

# Run as ``python -I -S -c _PROGRAM <supervisor pid> <pipe fd> <segments' path prefix>``.
_PROGRAM = """
import os, select, signal, sys
parent, fd = int(sys.argv[1]), int(sys.argv[2])
SHM, prefix = os.path.split(sys.argv[3])
os.set_blocking(fd, False)
signal.signal(signal.SIGINT, signal.SIG_IGN)
groups = set()
poller = select.poll()
poller.register(fd, select.POLLIN)
try:
    pidfd = os.pidfd_open(parent)
    poller.register(pidfd, select.POLLIN)
except (AttributeError, OSError):
    pidfd = -1
pending = b""

def take():
    global pending
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return False
        if not data:
            return True
        *lines, pending = (pending + data).split(b"\\n")
        for line in lines:
            if line[:1] == b"+":
                groups.add(int(line[1:]))
            elif line[:1] == b"-":
                groups.discard(int(line[1:]))

done = os.getppid() != parent  # it died before the pidfd was opened
while not done:
    events = poller.poll()
    done = take() or any(f == pidfd for f, _ in events)
take()
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
# EOF comes as the supervisor's descriptors close, a moment before its exit
# completes: the pidfd says when it has (a closing queue kills this process
# meanwhile: then what the queue made, it removed itself).
if pidfd >= 0:
    waiter = select.poll()
    waiter.register(pidfd, select.POLLIN)
    gone = bool(waiter.poll(2000))
else:
    for _ in range(200):
        gone = os.getppid() != parent
        if gone:
            break
        select.select([], [], [], 0.01)
if not gone:
    sys.exit()

def running(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False

import time
deadline = time.monotonic() + 5
while time.monotonic() < deadline:
    groups = {group for group in groups if running(group)}
    if not groups:
        break
    time.sleep(0.005)
try:
    names = os.listdir(SHM)
except OSError:
    names = []
for name in names:
    if name.startswith(prefix):
        try:
            os.unlink(os.path.join(SHM, name))
        except OSError:
            pass
"""


class Undertaker:
    """The supervisor's side of its undertaker (see the module docstring).
    Only the I/O thread calls it."""

    __slots__ = ("_process", "_read_fd", "_write_fd")

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()  # both close-on-exec: no worker inherits them
        os.set_blocking(self._write_fd, False)
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the undertaker, unless it was started (or stopped) before. A
        failure to start it is no reason to refuse the queue: it then works
        without one, as before it existed."""
        if self._read_fd < 0:
            return
        try:
            segments = os.path.join(SHM_DIR, segment_prefix())
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _PROGRAM, str(os.getpid()), str(self._read_fd), segments],
                # Not the supervisor's stdout and stderr: a program that reads
                # them to their end (the supervisor's parent, say) must not
                # wait on this process too.
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(self._read_fd,),
                start_new_session=True,
                cwd="/",
            )
        except (OSError, subprocess.SubprocessError):
            self._process = None
        finally:
            os.close(self._read_fd)
            self._read_fd = -1

    def watch(self, pgid: int | None) -> None:
        """A worker started, leading (or about to lead) the process group ``pgid``."""
        if pgid is not None:
            self._send(b"+%d\n" % pgid)

    def forget(self, pgid: int | None) -> None:
        """The worker that leads ``pgid`` is about to be reaped: its group id may be reused after that."""
        if pgid is not None:
            self._send(b"-%d\n" % pgid)

    def stop(self) -> None:
        """End the undertaker and reap it: every worker is reaped (and
        forgotten) by now, so it has nothing left to kill."""
        for fd in (self._read_fd, self._write_fd):  # (the read end is still here if it never started)
            if fd >= 0:
                os.close(fd)
        self._read_fd = self._write_fd = -1
        process, self._process = self._process, None
        if process is not None:
            process.kill()  # SIGKILL: works on a stopped process too
            process.wait()

    def _send(self, line: bytes) -> None:
        # Dropped if the pipe is full (a stopped undertaker) or broken (it was killed).
        with contextlib.suppress(OSError):
            os.write(self._write_fd, line)
