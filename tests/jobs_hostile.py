"""Hostile jobs for test_hostile: code in an untrusted lane's job process that
attacks the supervisor through its channel, or through resources.

An untrusted lane's job runs in a process forked for it by a fresh ``python -I``
worker; that process's only socket is its channel to the worker, which relays
what it writes to the supervisor. A hostile job finds it among its descriptors
and writes raw ``multiprocessing.Connection`` frames to it (a 4-byte big-endian
signed length, or -1 and an 8-byte length, then the body), bypassing the
honest codec.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import socket
import struct
import sys
import time
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
        raise RuntimeError(f"expected exactly one socket (the job's channel), found {sockets}")
    return sockets[0]


def _own_job_id() -> int:
    """The id the supervisor gave the running job (a local of procq's code that runs it)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith("procq._worker.trusted") and "job_id" in frame.f_locals:
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


def write_then_block(data: bytes, started: str | None = None) -> None:
    """Write ``data`` raw to the pipe (tell the test on ``started``), then block."""
    _write(data)
    if started is not None:
        jobs.signal_test(started)
    jobs.block_forever()


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


def forge_two(first: list[Any], second: list[Any], report: str | None = None) -> None:
    """Send two messages, ``"<id>"`` replaced by this job's id (written to ``report``), then block."""
    job_id = _own_job_id()
    if report is not None:
        with open(report, "w") as f:
            f.write(str(job_id))
    data = b"".join(
        frame(json.dumps([job_id if part == "<id>" else part for part in m]).encode()) for m in (first, second)
    )
    write_then_block(data)


def close_pipe_then_exit() -> None:
    os.close(_pipe_fd())
    os._exit(0)


def close_pipe_then_block() -> None:
    os.close(_pipe_fd())
    jobs.block_forever()


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
        # The kernel does not apply RLIMIT_NPROC to uid 0 (nor to a process with
        # CAP_SYS_RESOURCE or CAP_SYS_ADMIN): a bomb run as root is held by
        # nothing. The job tries to become "nobody"; an untrusted job cannot
        # (procq took CAP_SETUID from it), and reports that it is still uid 0.
        with contextlib.suppress(PermissionError):
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
    jobs.block_forever()


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


def spin_forever() -> None:
    while True:
        pass


# --- Honest jobs with awkward results -----------------------------------------------------


def awkward_result(kind: str) -> Any:
    if kind == "set":
        return {1, 2}
    if kind == "object":
        return object()
    if kind == "bytes":
        return b"raw"
    raise ValueError(kind)


def text_of_size(size: int) -> str:
    return "x" * size


# --- Answering for the worker's next job --------------------------------------------------


def answer_for_the_next_job(forged: Any, report: str) -> str:
    """Report this job done at once (a well-formed OK for its own id), then
    try to read the job the supervisor sends next and answer for it with
    ``forged``, without running it. Writes to ``report`` how far it got
    ("no next job": its channel gave it nothing but EOF), then exits at once,
    without another answer."""
    from multiprocessing.connection import Connection

    conn = Connection(os.dup(_pipe_fd()))
    conn.send_bytes(json.dumps(["ok", _own_job_id(), "done"]).encode())
    try:
        frame = conn.recv_bytes()
    except EOFError:
        _report(report, "no next job")
        os._exit(0)
    next_id = pickle.loads(frame)[1]
    conn.send_bytes(json.dumps(["ok", next_id, forged]).encode())
    _report(report, f"answered for job id {next_id}")
    try:
        conn.recv_bytes()
    finally:
        os._exit(0)


def _report(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


# --- What a job's own process holds ----------------------------------------------------------


def channel_peers() -> dict[str, Any]:
    """This process's descriptors, and for each socket the pid of the process
    that made it (``SO_PEERCRED``: the worker for the job's channel, the
    supervisor for the worker's pipe)."""
    fds = {}
    for fd in range(1024):
        with contextlib.suppress(OSError):
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
    peers = []
    for fd, link in fds.items():
        if link.startswith("socket:"):
            sock = socket.socket(fileno=os.dup(fd))
            try:
                cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            finally:
                sock.close()
            peers.append(struct.unpack("3i", cred)[0])
    # Descriptor numbers as str: an untrusted job's dict keys must be (JSON's).
    named = {str(fd): link for fd, link in fds.items()}
    return {"fds": named, "peers": peers, "pid": os.getpid(), "ppid": os.getppid()}


def burn_cpu(seconds: float) -> float:
    """Use ``seconds`` of CPU time (of this process); return the CPU time it used."""
    while time.process_time() < seconds:
        pass
    return time.process_time()


_HOARD: list[bytearray] = []


def hoard(mib: int) -> int:
    """Keep ``mib`` MiB alive at module level; return how many MiB earlier jobs left there."""
    before = sum(len(b) for b in _HOARD) >> 20
    _HOARD.append(bytearray(b"\x01") * (mib << 20))
    return before


def raise_own_limits() -> dict[str, str | None]:
    """Try to lift this process's CPU and address-space limits (as "nobody"
    if run as root, which the kernel lets raise any limit); what each attempt raised."""
    import resource

    if os.getuid() == 0:
        with contextlib.suppress(PermissionError):  # an untrusted job has no CAP_SETUID: it stays uid 0
            os.setuid(65534)
    tried: dict[str, str | None] = {}
    for name, which in (("cpu", resource.RLIMIT_CPU), ("as", resource.RLIMIT_AS)):
        try:
            resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            tried[name] = None
        except (ValueError, OSError) as exc:
            tried[name] = type(exc).__name__
    return tried


def signal_self(signum: int) -> None:
    os.kill(os.getpid(), signum)


def leave_a_holder(started: str) -> int:
    """Fork a process that keeps this job's channel open and blocks (telling
    the test on ``started``); return its pid at once."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the leftover process only waits to be killed
        try:
            jobs.signal_test(started)
            jobs.block_forever()
        finally:
            os._exit(0)
    return pid
