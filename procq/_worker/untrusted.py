"""An untrusted lane's worker: a clean process that runs each job in a
process forked for it, and relays that process's answer.

It is a fresh interpreter (``python -I``) started by the supervisor, not a
``multiprocessing`` child, and it never runs job code or unpickles anything a
job sent: so a hostile job cannot see the supervisor's pipe, another job's
work, or what the worker does next. What a job's process writes is relayed
with a trailer byte that says so (see ``_wire.protocol``), and the supervisor
checks every message.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import socket
import struct
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from procq._system.privileges import confine_job, drop_privileges, landlock_abi, set_dumpable, set_pdeathsig
from procq._wire.json_keys import check_keys
from procq._wire.protocol import (
    FROM_WORKER,
    RUN,
    FnMirror,
    json_dumps,
)
from procq._wire.startmark import open_mark
from procq._worker.limits import address_limit
from procq._worker.relay import RELAY_CHUNK, Relay
from procq._worker.trusted import (
    _boot,
    _close_inherited_fds,
    _Json,
    _rlimit,
    call_and_report,
    run_until_eof,
    setup,
)

__all__ = ["exec_main"]


def exec_main() -> None:
    """An untrusted lane's worker: a fresh interpreter started by the
    supervisor as ``python -I -c ... CONFIG CONN_FD ALIVE_FD``.

    It never runs job code, and never unpickles anything a job sent: each job
    runs in a process of its own, forked for it (see ``_serve_forking``). The
    lane's ``rlimits`` are set in those processes, not here.

    Before it says READY it is untraceable (not dumpable: its jobs' processes
    inherit that) and holds no privilege: no capability, even as root, and
    ``no_new_privs``, so no job can gain one back by exec. A worker that
    cannot drop them exits with the reason on stderr and never takes a job.
    A sandboxed lane's worker first enters its sandbox (``_worker.sandbox``):
    then it is pid 1 of namespaces of its own, the process started here
    waiting outside for it, and each job is confined before it runs.
    """
    set_dumpable(False)
    _boot()
    config = json.loads(sys.argv[1])
    conn_fd, alive_fd = int(sys.argv[2]), int(sys.argv[3])
    global _mark
    mark_fd = int(sys.argv[5])
    _mark = open_mark(None if mark_fd < 0 else mark_fd)  # (mapped, its descriptor closed: nothing to keep)
    conn = Connection(conn_fd)
    bridge = (config.get("sandbox") or {}).get("bridge")  # to the egress proxy (see _worker.sandbox)
    setup({**config, "rlimits": None}, {conn_fd, alive_fd} | ({bridge} if bridge is not None else set()))
    # Several workers share the liveness pipe's read end: whoever reads a byte
    # someone wrote into it takes it, and the others must not block on it.
    os.set_blocking(alive_fd, False)
    # No thread watches the supervisor here (this loop waits on its liveness
    # pipe itself), so forking a job's process is safe.
    set_pdeathsig()
    if config.get("sandbox"):  # its namespaces and its jobs' view, made while it still may
        global _sandbox
        from procq._worker.sandbox import enter

        _sandbox = enter(config["sandbox"], json.loads(sys.argv[4]), {conn_fd, alive_fd})
        if _sandbox.nproc is not None and config.get("rlimits"):
            # The sandbox's RLIMIT_NPROC holds the lane's "nproc" already, and
            # counts the worker's own processes, which the lane's does not.
            config["rlimits"].pop("nproc", None)
    try:
        drop_privileges()
    except OSError as exc:
        print(f"procq: an untrusted worker could not drop its privileges: {exc}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
    config["landlock"] = landlock_abi()
    # What every job's process needs, imported once here rather than in each of them.
    import fcntl  # noqa: F401
    import resource  # noqa: F401
    import select  # noqa: F401
    import termios  # noqa: F401
    from multiprocessing import resource_tracker  # noqa: F401

    run_until_eof(lambda: _serve_forking(conn, config, alive_fd))


# --- untrusted lanes: a forked process per job --------------------------------------

#: The share of its CPU limit a job killed with SIGKILL must have used to count
#: as having reached it. The kernel checks the limit against CPU time counted
#: in scheduler ticks, which on a busy machine runs ahead of the precise time
#: it reports afterwards (here by up to 16 %: killed at "1 s" after 0.84 s).
_CPU_REACHED = 0.75

# The running job's process, while there is one (read by the SIGTERM handler).
_child_pid = 0
# A sandboxed lane's worker: its sandbox (see ``_worker.sandbox``).
_sandbox: Any = None
# The page in which each job's process says it starts its job (``_wire.startmark``).
_mark: memoryview | None = None
_terminating = False


def _supervisor_died(alive_fd: int) -> bool:
    """The liveness pipe is readable: is it at EOF (only the supervisor holds
    its write end, so EOF is its death)? Bytes a process wrote into it through
    ``/proc`` are read and dropped: they prove nothing."""
    try:
        while True:
            data = os.read(alive_fd, 4096)
            if not data:
                return True
    except (BlockingIOError, InterruptedError):
        return False  # drained (or another worker took them): still alive


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM (a timeout or a cancel, sent to the worker's whole process
    group): with a job running, the worker waits for the job's process, which
    got the signal too and may clean up, and dies after it; idle, at once."""
    global _terminating
    if _child_pid:
        _terminating = True
    else:
        _die_of(signal.SIGTERM)


def _die_of(sig: int) -> None:
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # pragma: no cover - the signal ends us first


def _serve_forking(conn: Connection, config: dict[str, Any], alive_fd: int) -> None:
    """The untrusted worker's loop: for each RUN frame, fork a process that
    runs the job (``_job_process``), relay what it writes (``Relay``), and
    report its exit status: ``["exit", job_id, returncode]``.

    The function cache holds functions' pickled bytes, never the functions:
    unpickling them is the job process's work.
    """
    import select

    signal.signal(signal.SIGTERM, _on_sigterm)
    fns = FnMirror()
    conn_fd = conn.fileno()
    send, recv, loads = conn.send_bytes, conn.recv_bytes, pickle.loads
    send(json_dumps(["ready"]) + FROM_WORKER)
    while True:
        if _terminating:
            _die_of(signal.SIGTERM)
        ready, _, _ = select.select([conn_fd, alive_fd], [], [])
        if alive_fd in ready and _supervisor_died(alive_fd):
            return
        if conn_fd not in ready:
            continue
        try:
            frame = recv()
        except (EOFError, OSError):
            return
        # The supervisor's own pickle of plain values: the job's bytes stay bytes.
        tag, job_id, fn_id, fn_bytes, args_bytes, memory_limit = loads(frame)
        assert tag == RUN
        if fn_bytes is None:
            fn_bytes = fns.get(fn_id)
            fns.touch(fn_id)
        else:
            fns.touch(fn_id, fn_bytes)
        returncode = _fork_job(conn_fd, alive_fd, config, job_id, fn_bytes, args_bytes, memory_limit)
        if returncode is None:
            return  # the supervisor died while the job ran
        if _terminating:
            _die_of(signal.SIGTERM)  # its job is ended by the supervisor; nothing to report
        if _sandbox is not None and _sandbox.memory_killed:
            send(json_dumps(["exit", job_id, returncode, "memory"]) + FROM_WORKER)
        else:
            send(json_dumps(["exit", job_id, returncode]) + FROM_WORKER)


def _fork_job(
    conn_fd: int,
    alive_fd: int,
    config: dict[str, Any],
    job_id: int,
    fn_bytes: bytes,
    args_bytes: bytes,
    memory_limit: int | None,
) -> int | None:
    """Run one job in a forked process; relay its frames to ``conn_fd``.
    Returns its exit status once it has exited, or None if the worker must
    stop: the supervisor died, or (sandboxed) the process outside is gone."""
    global _child_pid
    if _sandbox is not None and not _sandbox.admit():
        return None  # the process the supervisor knows as this worker is gone: so is the worker
    sys.stdout.flush()
    sys.stderr.flush()
    tmp = _sandbox.job_dir() if _sandbox is not None else None
    ours, theirs = socket.socketpair()
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the job's process (coverage does not follow it)
            _job_process(theirs, job_id, fn_bytes, args_bytes, memory_limit, config, tmp)
        _child_pid = pid
    finally:
        theirs.close()
    try:
        ours.shutdown(socket.SHUT_WR)  # the job reads nothing from the worker: EOF at once
        relay = Relay(conn_fd)
        cpu_limit = (config.get("rlimits") or {}).get("cpu")
        returncode = _relay_until_exit(pid, ours, alive_fd, relay, cpu_limit)
        if returncode is not None:
            relay.finish()
        return returncode
    finally:
        _child_pid = 0
        ours.close()
        if tmp is not None:
            _sandbox.after(tmp)


def _relay_until_exit(
    pid: int, channel: socket.socket, alive_fd: int, relay: Relay, cpu_limit: int | None
) -> int | None:
    """Copy what the job's process writes until it exits; then what it left
    unread in the channel, and no more (a process it started may still hold
    the channel open, and is no reason to wait). Its exit status, or None if
    the supervisor died first (then the job's process is killed)."""
    import select

    pidfd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        chan_fd = channel.fileno()
        poller.register(chan_fd, select.POLLIN)
        poller.register(pidfd, select.POLLIN)
        poller.register(alive_fd, select.POLLIN)
        open_channel = True
        exited = False
        while not exited:
            for fd, _ in poller.poll():
                if fd == alive_fd and _supervisor_died(alive_fd):
                    os.kill(pid, signal.SIGKILL)
                    return None
                if fd == pidfd:
                    exited = True
                elif fd == chan_fd:
                    data = channel.recv(RELAY_CHUNK)
                    if data:
                        relay.feed(data)
                    else:
                        poller.unregister(chan_fd)
                        open_channel = False
        if open_channel:
            import fcntl
            import termios

            left = struct.unpack("i", fcntl.ioctl(chan_fd, termios.FIONREAD, b"\0\0\0\0"))[0]
            while left > 0:
                try:
                    data = channel.recv(min(left, RELAY_CHUNK), socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    break
                if not data:
                    break
                relay.feed(data)
                left -= len(data)
        _, status, usage = os.wait4(pid, 0)
        return _exit_status(status, usage, cpu_limit)
    finally:
        os.close(pidfd)


def _exit_status(status: int, usage: Any, cpu_limit: int | None) -> int:
    """The job's process's exit status as the worker reports it: ``-SIGXCPU``
    when it was ended for its CPU-time limit. The limit is hard (see
    ``_hard_limits``): there the kernel sends SIGKILL, not SIGXCPU, so a
    SIGKILL once the process has used (about) its CPU limit is the limit."""
    code = os.waitstatus_to_exitcode(status)
    if (
        cpu_limit is not None
        and code in (-signal.SIGKILL, -signal.SIGXCPU)
        and usage.ru_utime + usage.ru_stime >= cpu_limit * _CPU_REACHED
    ):
        return -signal.SIGXCPU
    return code


def _job_process(
    channel: socket.socket,
    job_id: int,
    fn_bytes: bytes,
    args_bytes: bytes,
    memory_limit: int | None,
    config: dict[str, Any],
    tmp: str | None,
) -> NoReturn:
    """The forked process that runs one job and exits: it holds no descriptor
    but the standard streams and ``channel`` (not the supervisor's pipe, not
    the worker's), and runs under the lane's limits, set hard."""
    code = 0
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        worker = os.getppid()
        set_pdeathsig()
        if os.getppid() != worker:  # the worker died before the line above took effect
            os._exit(1)
        if tmp is not None:
            _sandbox.join()  # its cgroup's descriptors are closed next
        _close_inherited_fds({0, 1, 2, channel.fileno()})
        if tmp is not None:
            _sandbox.confine(tmp)  # all of it, or the job does not run
        else:
            # Best effort: where the kernel has Landlock, no ptrace-class access
            # (nor, from ABI 6, any signal) to a process outside this job's tree.
            with contextlib.suppress(OSError):
                confine_job(config.get("landlock") or 0)
        conn = Connection(channel.detach())
        _run_job(conn.send_bytes, job_id, fn_bytes, args_bytes, memory_limit, config)
    except (BrokenPipeError, ConnectionResetError):
        code = 1  # the job closed its channel: nobody is left to tell
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _hard_limits(rlimits: dict[str, int], memory_limit: int | None) -> None:
    """Set the lane's ``rlimits`` and the job's ``memory_limit`` in a job's
    own process, soft and hard alike, so the job cannot raise them (it has no
    CAP_SYS_RESOURCE: see ``exec_main``). The CPU time counts from the
    process's start; at the limit (soft and hard alike) the kernel ends the
    process with SIGKILL, so a job that ignores SIGXCPU ends there too."""
    import resource

    for name, value in rlimits.items():
        if name == "cpu":
            continue
        resource.setrlimit(_rlimit(name), (value, value))
    if "cpu" in rlimits:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU ends it: no core file
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        cpu = rlimits["cpu"]
        if hard != resource.RLIM_INFINITY:
            cpu = min(cpu, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    if memory_limit is not None:
        limit, _ = address_limit(memory_limit)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _say_started(job_id: int) -> None:
    """In a job's process, just before the job's code can first run: say
    that the job started (a death from now on is its own), then unmap the
    page, so that the job cannot write another id in it."""
    global _mark
    mark, _mark = _mark, None
    if mark is None:
        return
    page: Any = mark.obj  # (the mmap)
    mark[0] = job_id
    mark.release()
    page.close()


def _run_job(
    send: Callable[[bytes], None],
    job_id: int,
    fn_bytes: bytes,
    args_bytes: bytes,
    memory_limit: int | None,
    config: dict[str, Any],
) -> None:
    """Run one job of an untrusted lane (in its own process) and send its
    result or error, as JSON, marked as the job's by the relay."""
    codec = _Json()
    try:
        _hard_limits(config.get("rlimits") or {}, memory_limit)
    except BaseException as exc:
        send(codec.error(job_id, "error", exc, "(the lane's rlimits could not be set in the job's process)"))
        return
    _say_started(job_id)
    try:
        fn = pickle.loads(fn_bytes)
        args, kwargs = pickle.loads(args_bytes)
    except BaseException as exc:
        send(
            codec.error(job_id, "error", exc, "(the job's function or arguments could not be unpickled in the worker)")
        )
        return

    def call() -> Any:
        result = fn(*args, **kwargs) if kwargs else fn(*args)
        check_keys(result)
        return result

    call_and_report(
        codec,
        send,
        job_id,
        call,
        memory_limit,
        config.get("max_result_bytes"),
        "encoded as JSON (an untrusted lane's results must be)",
    )
