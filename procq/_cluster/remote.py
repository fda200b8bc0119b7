"""The far side of a Dask lane: what runs inside a Dask worker's process.

``run_job`` is the Dask task of every job of a ``DaskLane``. It never runs
the job itself: it hands it to a procq worker process of its own (a
``_Child``, running the trusted worker's loop, ``_worker._serve``), waits for
the job's end, its process's death, the job's deadline, its memory limit or a
kill from the supervisor, and returns what happened as a ``Finished`` tuple
(plain data, which Dask sends back as the task's result)::

    ("frame", frame, pid, address)          the worker's report: OK / ERROR, as a trusted
                                            lane's worker writes it on its pipe (``_wire.protocol``)
    ("exit", exitcode, pid, address)        the job's process died (a signal, os._exit, ...)
    ("timeout", exitcode, pid, address)     past its time limit: its process tree was killed
    ("memory", exitcode, pid, address, used)  past its memory limit: killed
    ("killed", exitcode, pid, address)      the supervisor asked (q.cancel, close without waiting)
    ("boot", message, None, address)        no worker process could be started

So a segfault, ``os._exit`` or a blown memory limit ends one procq process,
never the Dask worker, and the supervisor words each end as a local lane does.

Worker processes are kept between jobs in a pool per lane and queue
(``pool_id``), as a local lane keeps its workers; a process that crashed,
was killed or went over a limit is not reused, and ``max_jobs_per_worker``
and ``max_worker_rss`` retire them as they do locally. ``close_pool`` ends a
pool's processes when the queue closes. Each process is a fresh interpreter
(``subprocess``: a Dask worker is threaded, and may be a daemonic process
that ``multiprocessing`` refuses to start children from) holding the read end
of a pipe whose write end only this process holds: when the Dask worker dies,
however it dies, that pipe reaches EOF and its procq processes exit.

``kill_job`` reaches a running job: the supervisor runs it on every Dask
worker (``Client.run``, on the worker's event loop), and the one running the
job wakes the job's waiting thread, which ends the process tree (SIGTERM,
SIGKILL after the lane's ``kill_grace``; a later kill with a shorter grace,
from a queue closing without waiting, cuts it short). A kill that comes
before its job started leaves a mark, and the job then never starts.

This module is imported on Dask workers: it imports nothing of ``distributed``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from typing import Any

from procq._system.processes import children_map, pidfd, process_pss, process_rss, signal_group, tree_memory
from procq._wire.protocol import ERROR, READY, RUN, TRAILER, FnMirror
from procq._wire.startmark import StartMark

__all__ = ["child_main", "close_pool", "kill_job", "run_job"]

#: Finished: what ``run_job`` returns (see the module docstring).
Finished = tuple[Any, ...]

#: How long a new worker process may take to say READY.
BOOT_TIMEOUT = 60.0
#: How often a memory-limited job's process tree is measured (as the supervisor does locally).
MEMORY_CHECK_INTERVAL = 0.05
#: How many kills of jobs not (yet) started are remembered.
KILL_MARKS = 10_000

_CHILD_CODE = (
    "import json, sys; config = json.loads(sys.argv[3]); sys.path[:] = config['path']; "
    "from procq._cluster.remote import child_main; "
    "child_main(int(sys.argv[1]), int(sys.argv[2]), config, int(sys.argv[4]))"
)
#: A job whose worker process died before it started the job (a pooled
#: process killed while idle, say) is given to another process, at most
#: this many times in all (then it ends as the last death says).
UNSTARTED_TRIES = 3

_lock = threading.Lock()  # guards everything below
_pools: dict[str, _Pool] = {}
_running: dict[str, _Run] = {}  # token -> the job running under it
_killed: OrderedDict[str, float] = OrderedDict()  # tokens killed before their job started
_closed: OrderedDict[str, None] = OrderedDict()  # pools closed: a late task of theirs starts nothing
_alive: list[int] = []  # [read end, write end]: EOF on the read end when this process dies


# --- the worker process's side -----------------------------------------------


def child_main(fd: int, alive_fd: int, config: dict[str, Any], mark_fd: int = -1) -> None:
    """A pooled worker process's entry point: the trusted worker's loop on
    ``fd``, until EOF, or until this process's Dask worker dies. ``mark_fd``:
    the page in which it says which job it starts (``_wire.startmark``)."""
    from multiprocessing.connection import Connection

    from procq._wire.startmark import open_mark
    from procq._worker.trusted import _boot, _Pickled, _serve, run_until_eof, setup

    conn = Connection(fd)
    mark = open_mark(None if mark_fd < 0 else mark_fd)
    _boot()
    setup(config, {fd, alive_fd})

    def watch() -> None:  # only EOF is the Dask worker's death
        try:
            while os.read(alive_fd, 4096):
                pass
        except OSError:
            pass
        os._exit(1)

    threading.Thread(target=watch, name="procq-dask-worker-watch", daemon=True).start()
    run_until_eof(lambda: _serve(conn, config, _Pickled(), None, mark))


# --- the Dask worker's side ----------------------------------------------------


def _alive_fd() -> int:
    with _lock:
        if not _alive:
            r, w = os.pipe()
            os.set_inheritable(w, False)
            _alive.extend((r, w))
        return _alive[0]


class _Child:
    """One procq worker process on this Dask worker."""

    def __init__(self, config: dict[str, Any]) -> None:
        import socket
        from multiprocessing.connection import Connection

        ours, theirs = socket.socketpair()
        alive = _alive_fd()
        child_config = {**config, "path": list(sys.path)}
        self.mark = StartMark.create()
        mark_fd = -1 if self.mark is None else self.mark.fileno()
        argv = [sys.executable, "-c", _CHILD_CODE, str(theirs.fileno()), str(alive), json.dumps(child_config)]
        try:
            self.popen = subprocess.Popen(
                [*argv, str(mark_fd)],
                pass_fds=(theirs.fileno(), alive, *(() if mark_fd < 0 else (mark_fd,))),
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            ours.close()
            if self.mark is not None:
                self.mark.close()
            raise
        finally:
            theirs.close()
            if self.mark is not None:
                self.mark.close_fd()
        self.conn = Connection(ours.detach())
        self.pid: int = self.popen.pid
        sentinel = pidfd(self.pid)
        if sentinel is None:  # pragma: no cover - Linux before 5.3
            self.kill()
            raise OSError("a DaskLane's workers need pidfd_open (Linux 5.3 or later)")
        self.sentinel = sentinel
        self.fns = FnMirror()
        self.jobs = 0
        self._wait_ready()

    def _wait_ready(self) -> None:
        ready = select.poll()
        ready.register(self.conn.fileno(), select.POLLIN)
        if not ready.poll(BOOT_TIMEOUT * 1000):
            self.discard()
            raise OSError(f"a procq worker process did not start within {BOOT_TIMEOUT:g}s")
        try:
            frame = self.conn.recv_bytes()
        except (EOFError, OSError):
            code = self.discard()
            raise OSError(f"a procq worker process died while it started (exit code {code})") from None
        if TRAILER.unpack_from(frame, len(frame) - TRAILER.size)[1] != READY:
            self.discard()
            raise OSError("a procq worker process did not start as expected")

    def terminate(self) -> None:
        signal_group(self.pid, signal.SIGTERM)  # it leads its own session: its group is its tree
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        signal_group(self.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def end(self, grace: float, run: _Run | None = None) -> int | None:
        """End its tree now (SIGTERM, SIGKILL after ``grace``); its exit code.
        A kill of ``run`` meanwhile with a shorter grace (the queue closing
        without waiting: none) cuts the grace short."""
        if grace > 0:
            self.terminate()
            self._wait_exit(time.monotonic() + grace, run)
        return self.discard()

    def _wait_exit(self, deadline: float, run: _Run | None) -> None:
        """Wait until the process exits or ``deadline``, brought forward by kills of ``run``."""
        poller = select.poll()
        poller.register(self.sentinel, select.POLLIN)
        if run is not None:
            poller.register(run.wake_r, select.POLLIN)
        while (left := deadline - time.monotonic()) > 0:
            ready = {fd for fd, _ in poller.poll(int(left * 1000) + 1)}
            if self.sentinel in ready:
                return
            if run is not None and run.wake_r in ready:
                os.read(run.wake_r, 4096)
                if run.grace is not None:
                    deadline = min(deadline, time.monotonic() + run.grace)

    def started(self, job_id: int) -> bool:
        """Had it started job ``job_id`` (once it is dead)? True if it cannot tell."""
        return self.mark is None or self.mark.started() == job_id

    def discard(self) -> int | None:
        """Kill what is left of its tree, reap it and close its ends."""
        self.kill()
        code = self.popen.wait()
        signal_group(self.pid, signal.SIGKILL)  # (a leftover of its jobs)
        with contextlib.suppress(OSError):
            self.conn.close()
        with contextlib.suppress(OSError):
            os.close(self.sentinel)
        return code

    def retire(self) -> None:
        """Let it go between jobs: it exits on EOF; killed if it does not at once."""
        with contextlib.suppress(OSError):
            self.conn.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(1.0)
        self.kill()
        self.popen.wait()
        signal_group(self.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.close(self.sentinel)


class _Pool:
    """A lane's idle worker processes on this Dask worker."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.idle: list[_Child] = []
        self.closed = False

    def take(self) -> _Child:
        with _lock:
            if self.idle:
                return self.idle.pop()
        return _Child(self.config)

    def give_back(self, child: _Child) -> None:
        limit = self.config.get("max_jobs_per_worker")
        rss_limit = self.config.get("max_worker_rss")
        worn = limit is not None and child.jobs >= limit
        if worn or (rss_limit is not None and process_rss(child.pid) > rss_limit):
            child.retire()
            return
        with _lock:
            if not self.closed:
                self.idle.append(child)
                return
        child.retire()


class _Run:
    """A job running on this Dask worker: what ``kill_job`` wakes."""

    def __init__(self) -> None:
        self.wake_r, self.wake_w = os.pipe()
        self.grace: float | None = None  # set by a kill

    def kill(self, grace: float) -> None:
        self.grace = grace if self.grace is None else min(self.grace, grace)
        with contextlib.suppress(OSError):
            os.write(self.wake_w, b"k")

    def close(self) -> None:
        os.close(self.wake_r)
        os.close(self.wake_w)


def _address() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except Exception:  # not in a Dask worker (a test calling this directly)
        return f"pid {os.getpid()}"


def run_job(
    pool_id: str,
    config: dict[str, Any],
    token: str,
    job: tuple[int, bytes, bytes, bytes, int | None],
    timeout: float | None,
    grace: float,
) -> Finished:
    """The Dask task of one job (see the module docstring). ``job`` is a RUN
    frame's fields: (job_id, fn_id, fn_bytes, args_bytes, memory_limit)."""
    address = _address()
    run = _Run()
    with _lock:
        if _killed.pop(token, None) is not None or pool_id in _closed:
            run.close()
            return ("killed", None, None, address)
        _running[token] = run
        pool = _pools.get(pool_id)
        if pool is None:
            pool = _pools[pool_id] = _Pool(config)
    try:
        for tries_left in reversed(range(UNSTARTED_TRIES)):
            try:
                child = pool.take()
            except Exception as exc:
                return ("boot", f"{type(exc).__name__}: {exc}", None, address)
            finished = _supervise(child, run, job, timeout, grace, address)
            # A process that died before it started the job (killed while
            # idle in the pool, say) was not the job's doing: another runs it.
            if not (finished[0] == "exit" and tries_left and not child.started(job[0])):
                break
        if finished[0] == "frame" and not _retires(finished[1]):
            pool.give_back(child)
        elif finished[0] == "frame":
            child.retire()
        return finished
    finally:
        with _lock:
            _running.pop(token, None)
        run.close()


def _retires(frame: bytes) -> bool:
    """Must the process that wrote this report be replaced? (A job that went
    over its memory limit leaves a process that may be bloated or half broken,
    as a local lane's worker is replaced then.)"""
    end = len(frame) - TRAILER.size
    if TRAILER.unpack_from(frame, end)[1] != ERROR:
        return False
    from procq._wire.plain import load_data

    try:
        return bool(load_data(frame)[4] == "memory")
    except Exception:
        return True


def _supervise(
    child: _Child,
    run: _Run,
    job: tuple[int, bytes, bytes, bytes, int | None],
    timeout: float | None,
    grace: float,
    address: str,
) -> Finished:
    job_id, fn_id, fn_bytes, args_bytes, memory_limit = job
    send_fn: bytes | None = None if child.fns.touch(fn_id) else fn_bytes
    base = process_pss(child.pid) if memory_limit is not None else 0
    child.jobs += 1
    pid = child.pid
    try:
        child.conn.send_bytes(pickle.dumps((RUN, job_id, fn_id, send_fn, args_bytes, memory_limit), -1))
    except OSError:
        return ("exit", child.end(0), pid, address)
    poller = select.poll()
    for fd in (child.conn.fileno(), child.sentinel, run.wake_r):
        poller.register(fd, select.POLLIN)
    now = time.monotonic()
    deadline = None if timeout is None else now + timeout
    next_sample = now + MEMORY_CHECK_INTERVAL if memory_limit is not None else None
    while True:
        waits = [t - time.monotonic() for t in (deadline, next_sample) if t is not None]
        wait_ms = None if not waits else max(0, int(min(waits) * 1000) + 1)
        ready = {fd for fd, _ in poller.poll(wait_ms)}
        if child.conn.fileno() in ready:  # the job's report (even if a death follows: it counts)
            try:
                frame = child.conn.recv_bytes()
            except (EOFError, OSError):
                return ("exit", child.end(0), pid, address)
            return ("frame", frame, pid, address)
        if child.sentinel in ready:
            return ("exit", child.end(0), pid, address)
        if run.grace is not None:
            return ("killed", child.end(run.grace, run), pid, address)
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return ("timeout", child.end(grace, run), pid, address)
        if next_sample is not None and now >= next_sample:
            assert memory_limit is not None
            used = tree_memory(pid, children_map(), base, memory_limit)
            if used > memory_limit:
                return ("memory", child.end(0), pid, address, used)
            next_sample = now + MEMORY_CHECK_INTERVAL


def kill_job(token: str, grace: float) -> bool:
    """End the job running under ``token`` on this Dask worker, if it runs
    here; else remember the kill, should the job start here later. Runs on
    the Dask worker's event loop (``Client.run``): it only wakes the job's
    thread. True if the job ran here."""
    with _lock:
        run = _running.get(token)
        if run is not None:
            run.kill(grace)
            return True
        _killed[token] = grace
        while len(_killed) > KILL_MARKS:
            _killed.popitem(last=False)
    return False


def close_pool(pool_id: str) -> int:
    """End the idle worker processes of a queue's lane on this Dask worker
    (its queue closed); a process still running a job is ended when the job
    ends. Returns how many were ended."""
    with _lock:
        pool = _pools.pop(pool_id, None)
        _closed[pool_id] = None
        while len(_closed) > KILL_MARKS:
            _closed.popitem(last=False)
        if pool is None:
            return 0
        pool.closed = True
        idle, pool.idle = pool.idle, []
    for child in idle:
        child.retire()
    return len(idle)
