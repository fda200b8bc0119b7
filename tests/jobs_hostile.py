"""Hostile jobs for test_hostile: code in an untrusted lane's worker that
attacks the supervisor through the worker's pipe, or through resources.

An untrusted worker is a fresh ``python -I`` whose only socket is its pipe to
the supervisor; a hostile job finds it among its descriptors and writes raw
``multiprocessing.Connection`` frames to it (a 4-byte big-endian signed length,
or -1 and an 8-byte length, then the body), bypassing the worker's honest codec.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import sys
from typing import Any

import jobs


def _pipe_fd() -> int:
    sockets = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                sockets.append(int(name))
        except OSError:
            pass
    if len(sockets) != 1:
        raise RuntimeError(f"expected exactly one socket (the worker's pipe), found {sockets}")
    return sockets[0]


def _own_job_id() -> int:
    """The id the supervisor gave the running job (a local of the worker's loop)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "procq._worker" and "job_id" in frame.f_locals:
            return int(frame.f_locals["job_id"])
        frame = frame.f_back  # type: ignore[assignment]
    raise RuntimeError("not running in a procq worker")


def frame(payload: bytes) -> bytes:
    """A whole frame holding ``payload``."""
    return struct.pack("!i", len(payload)) + payload


def _write(data: bytes) -> None:
    fd = _pipe_fd()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def block_forever() -> None:
    r, _w = os.pipe()
    os.read(r, 1)


def write_then_block(data: bytes, started: str | None = None) -> None:
    """Write ``data`` raw to the pipe (tell the test on ``started``), then block."""
    _write(data)
    if started is not None:
        jobs.signal_test(started)
    block_forever()


def write_then_exit(data: bytes, code: int = 0) -> None:
    _write(data)
    os._exit(code)


def forge(message: list[Any], delta: int, report: str | None = None) -> None:
    """Send ``message`` as JSON, with every ``"<id>"`` in it replaced by this
    job's id plus ``delta`` (that id is written to ``report``), then block."""
    job_id = _own_job_id() + delta
    if report is not None:
        with open(report, "w") as f:
            f.write(str(job_id))
    forged = [job_id if part == "<id>" else part for part in message]
    write_then_block(frame(json.dumps(forged).encode()))


def close_pipe_then_exit() -> None:
    os.close(_pipe_fd())
    os._exit(0)


def close_pipe_then_block() -> None:
    os.close(_pipe_fd())
    block_forever()


class Evil:
    """Unpickling this runs ``os.mkdir(path)``: proof that code ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


def crafted_pickle(path: str) -> bytes:
    """A frame body shaped like a trusted worker's OK message whose unpickling,
    outer or inner, makes the directory ``path``."""
    return pickle.dumps((1, 1, pickle.dumps(Evil(path)), Evil(path)))


# --- Resource abuse -------------------------------------------------------------------


def fork_bomb(report: str, most: int) -> None:
    """Fork children (each blocked on a pipe) until a fork fails or ``most``
    succeeded; write ``{"forks", "errno", "pids", "uid"}`` as JSON to
    ``report``, then block until killed."""
    fd = os.open(report, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)  # while still allowed to
    if os.getuid() == 0:
        # The kernel does not apply RLIMIT_NPROC to root (nor to a process with
        # CAP_SYS_RESOURCE or CAP_SYS_ADMIN): a bomb run as root is held by
        # nothing. The tests run as root, so the job first becomes "nobody",
        # which drops every capability, as an untrusted job would normally run.
        os.setuid(65534)
    r, _w = os.pipe()
    pids: list[int] = []
    error = None
    for _ in range(most):
        try:
            pid = os.fork()
        except OSError as exc:
            error = exc.errno
            break
        if pid == 0:  # pragma: no cover - the child only waits to be killed
            os.read(r, 1)
            os._exit(0)
        pids.append(pid)
    os.write(fd, json.dumps({"forks": len(pids), "errno": error, "pids": pids, "uid": os.getuid()}).encode())
    os.close(fd)
    block_forever()


def write_file(path: str, mib: int) -> int:
    """Write ``mib`` MiB to ``path``, 1 MiB at a time; return the bytes written."""
    chunk = b"x" * (1 << 20)
    written = 0
    with open(path, "wb") as f:
        for _ in range(mib):
            written += f.write(chunk)
    return written


def open_files(most: int) -> dict[str, Any]:
    """Open /dev/null until it fails or ``most`` are open; how far it got."""
    fds = []
    error = None
    try:
        for _ in range(most):
            fds.append(os.open(os.devnull, os.O_RDONLY))
    except OSError as exc:
        error = exc.errno
    finally:
        for fd in fds:
            os.close(fd)
    return {"opened": len(fds), "errno": error}


def spin() -> None:
    while True:
        pass


# --- Honest jobs with awkward results -----------------------------------------------------


def make(kind: str) -> Any:
    if kind == "set":
        return {1, 2}
    if kind == "object":
        return object()
    if kind == "bytes":
        return b"raw"
    raise ValueError(kind)


def text(size: int) -> str:
    return "x" * size


# --- Answering for the worker's next job --------------------------------------------------


def answer_for_the_next_job(forged: Any) -> str:
    """Report this job done at once (a well-formed OK for its own id), then
    read the job the supervisor sends this worker next and answer for it with
    ``forged``, without running it; then wait for the pipe to close."""
    from multiprocessing.connection import Connection

    conn = Connection(os.dup(_pipe_fd()))
    conn.send_bytes(json.dumps(["ok", _own_job_id(), "done"]).encode())
    try:
        frame = conn.recv_bytes()
    except EOFError:  # the supervisor closed the pipe: no next job here
        return "no next job"
    next_id = pickle.loads(frame)[1]
    conn.send_bytes(json.dumps(["ok", next_id, forged]).encode())
    try:
        conn.recv_bytes()
    finally:
        os._exit(0)
