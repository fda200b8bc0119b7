"""Job functions for the tests, in a small module the workers can import quickly."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from typing import Any


def square(x: int) -> int:
    return x * x


def identity(x: Any) -> Any:
    return x


def getpid() -> int:
    return os.getpid()


def worker_pid() -> int:
    """The pid of the worker running this job: this process, or its parent
    for an untrusted lane's job (which runs in a process its worker forked for it)."""
    untrusted = getattr(sys.modules.get("procq._worker.untrusted"), "__file__", None)
    frame: Any = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "_run_job" and frame.f_code.co_filename == untrusted:
            return os.getppid()
        frame = frame.f_back
    return os.getpid()


def boom(message: str = "boom") -> None:
    raise ValueError(message)


def segfault() -> None:
    ctypes.string_at(0)


def sigkill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def exit_now(code: int = 3) -> None:
    os._exit(code)


def abort() -> None:
    os.abort()


def block_forever() -> None:
    """Block on a pipe nobody writes to (the thing a timeout, a cancel or a kill ends)."""
    r, _w = os.pipe()
    os.read(r, 1)


def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


# --- Synchronising tests with jobs, through named pipes (FIFOs) ----------------
#
# A job signals the test with ``signal_test(path)``; the test waits for it with
# ``wait_signal(path, timeout)``. The test lets a job go with ``release(path)``;
# the job waits for that with ``wait_released(path)``. Every wait is on the pipe
# itself: no sleeping, no polling.


def fifo(directory: Any, name: str) -> str:
    path = os.path.join(str(directory), name)
    os.mkfifo(path)
    return path


def signal_test(path: str, data: bytes = b"1") -> None:
    """(In a job) tell the test something; blocks until the test listens."""
    with open(path, "wb") as f:
        f.write(data)


def wait_signal(path: str, timeout: float = 20.0) -> bytes:
    """(In the test) wait up to ``timeout`` for a job's ``signal_test``."""
    import select

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            raise TimeoutError(f"no signal on {path} within {timeout}s")
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def release(path: str) -> int:
    """(In the test) let every job waiting on ``path`` go. Returns an fd to close later."""
    fd = os.open(path, os.O_RDWR)
    os.write(fd, b"go" * 64)
    return fd


def wait_released(path: str) -> None:
    """(In a job) block until the test calls ``release(path)``."""
    # One unbuffered byte, so each waiter takes only its own share of release()'s bytes.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.read(fd, 1)
    finally:
        os.close(fd)


def signal_and_wait(started: str, go: str) -> int:
    """(A job) report its worker's pid on ``started``, then wait for ``go``. Returns that pid."""
    signal_test(started, str(worker_pid()).encode())
    wait_released(go)
    return worker_pid()
