"""Jobs that go for the supervisor's terminal (test_terminal): read what
is typed, change its modes and size, reach it through any descriptor."""

from __future__ import annotations

import errno
import fcntl
import os
import select
import struct
import termios
from typing import Any


def _why(exc: OSError | termios.error) -> str:
    code = exc.errno if isinstance(exc, OSError) else exc.args[0]
    return errno.errorcode.get(code, str(code))


def go_for_the_terminal(lane: str) -> dict[str, Any]:
    """Print a line; then, on each of fds 0, 1 and 2: is it a terminal, is
    there anything to read (read it), turn ``ECHO`` off, set the window size;
    open ``/dev/tty``; where every descriptor leads."""
    print(f"hello from a job of lane {lane}", flush=True)
    said: dict[str, Any] = {}
    for fd in (0, 1, 2):
        tried: dict[str, Any] = {"tty": os.isatty(fd)}
        try:
            readable = bool(select.select([fd], [], [], 0)[0])
        except OSError as exc:
            readable = False
            tried["select"] = _why(exc)
        if readable:
            try:
                tried["read"] = os.read(fd, 4096).decode(errors="replace")
            except OSError as exc:
                tried["read"] = _why(exc)
        try:
            attrs = termios.tcgetattr(fd)
            attrs[3] &= ~termios.ECHO
            termios.tcsetattr(fd, termios.TCSANOW, attrs)
            tried["echo off"] = "done"
        except termios.error as exc:
            tried["echo off"] = _why(exc)
        try:
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 3, 7, 0, 0))
            tried["window size"] = "done"
        except OSError as exc:
            tried["window size"] = _why(exc)
        said[str(fd)] = tried
    try:
        os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
        said["/dev/tty"] = "opened"
    except OSError as exc:
        said["/dev/tty"] = _why(exc)
    links = []
    for name in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{name}"))
        except OSError:
            continue
    said["fds"] = sorted(links)
    return said


def flood(mib: int) -> int:
    """Write ``mib`` MiB of byte 1 to stdout, a MiB at a time; how many were written."""
    block = b"\x01" * (1 << 20)
    for _ in range(mib):
        view = memoryview(block)
        while view:
            view = view[os.write(1, view) :]
    return mib
