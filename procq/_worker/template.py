"""A trusted lane's template: a booted process that forks the lane's
replacement workers, so that a crash costs one fork of a warm process.

Why: a worker started through the ``multiprocessing`` forkserver is a round
trip to the server, then, in the child, the unpickling of what spawn sends
(its preparation data, the ``Process`` object) and the bootstrap of a
``multiprocessing`` child, before procq's first line. The template has done
all of that once: procq, the forkserver's preloads and the main module are
imported, and it waits, single-threaded, for the next start.

The template (``template_main``) is itself a child of the forkserver,
started on the queue's starter thread at the lane's first start off the I/O
thread (a replacement or a spare; the queue's first workers start through
the forkserver, so ``ProcQueue()`` never waits for it), or as the lane first
learns a module its jobs needed (``_worker.warm``). It leads its own
session, and waits on three things at once (one ``poll``, no thread: a
thread would be copied into every fork):

- its request pipe: each request is the lane's settings as they are now,
  the modules the lane's jobs needed (``_worker.warm``: it imports those it
  has not tried first) and the new worker's end of its pipe (``SCM_RIGHTS``;
  none for a request that only imports); it forks and answers the child's
  pid, with the modules it imported and those it dropped. EOF: the queue is
  closing, it exits;
- the supervisor's sentinel (``multiprocessing``'s parent sentinel: EOF
  when the supervisor's process dies): it exits;
- SIGCHLD (a wake-up pipe): it reaps each dead worker and writes its pid and
  exit code (negative: the signal) on its exit pipe.

A worker it forks (``_worker.forked_worker``) is the template's child, not
the supervisor's. The supervisor still sees its death through a pidfd (any
process of the same user has one), and learns its exit code from the
template's exit pipe (``Template.exit_code``, read by the I/O thread when it
reaps the worker), as the forkserver tells ``multiprocessing`` the exit code
of each child it forks. The worker exits when the supervisor dies (its
sentinel) and when the template dies (``PR_SET_PDEATHSIG``: its parent), as
a forkserver's children die with the forkserver; the template dies with the
forkserver, which exits once the supervisor is gone. A template found dead
is replaced by a new one at the next start (``template_for``); the exit code
of a worker that outlived the template it came from is lost ("vanished
without an exit status").
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import select
import signal
import struct
import sys
import time
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from procq._system.processes import pidfd
from procq._worker.warm import WARM_TIMEOUT, Learned, import_learned

if TYPE_CHECKING:
    from procq._worker.initializer import WorkerInit

__all__ = ["LaneTemplates", "Template", "TemplateChild", "template_main"]

#: What the exit pipe carries per worker: its pid and its exit code (negative: the signal).
_EXIT = struct.Struct("=qq")
#: How long the I/O thread waits for the template to report a dead worker's
#: exit code (it reaps at once; only a stopped template is slower).
EXIT_REPORT_TIMEOUT = 2.0
#: How long the starter thread waits for the template's answer to a start
#: (a fork: milliseconds).
FORK_TIMEOUT = 10.0


class Template:
    """A lane's template, from the supervisor's side. ``fork`` and ``alive``
    run on the starter thread; ``exit_code`` on the I/O thread (its own pipe);
    ``close`` on the I/O thread once the queue has stopped and every worker
    it forked is reaped."""

    def __init__(self, context: Any, name: str, config: dict[str, Any], init: WorkerInit | None = None) -> None:
        self.requests, their_requests = context.Pipe(duplex=True)
        self._exits, their_exits = context.Pipe(duplex=False)
        try:
            process = context.Process(
                target=template_main, args=(their_requests, their_exits, config, init), name=name, daemon=False
            )
            process.start()
        except BaseException:
            self.requests.close()
            self._exits.close()
            raise
        finally:
            their_requests.close()
            their_exits.close()
        # As for a worker (see TrustedChannel.start): only the I/O thread waits for it.
        multiprocessing.process._children.discard(process)  # type: ignore[attr-defined]
        self.process = process
        self.pid: int = process.pid
        self._pidfd = pidfd(process.pid)
        self._reported: dict[int, int] = {}  # exit codes read ahead of their reap (I/O thread)
        self._ended = False  # its exit pipe reached EOF (I/O thread)
        # Learned modules it has imported or dropped, and whether it forks no
        # more (a module started a thread in it): starter thread only.
        self._tried: set[str] = set()
        self.retired = False

    def alive(self) -> bool:
        if self._pidfd is None:  # pragma: no cover - templates are only made where pidfds are
            return False
        return not self.retired and not select.select([self._pidfd], [], [], 0)[0]

    def fork(
        self, conn: Connection, config: dict[str, Any], mark: int, learned: Learned | None = None
    ) -> TemplateChild:
        """Have the template fork a worker on ``conn`` (the worker's end, which
        the caller closes after), that says which job it starts in the page
        ``mark`` (``_wire.startmark``), after it imports the modules
        ``learned`` holds (``_worker.warm``); raises ``OSError`` or
        ``EOFError`` if the template is gone or forks no more."""
        pid = self._ask(conn, config, learned, mark)
        assert pid is not None
        return TemplateChild(self, pid)

    def warm(self, learned: Learned) -> None:
        """Have the template import what ``learned`` holds and it has not
        tried, forking nothing; raises as ``fork`` does."""
        if any(name not in self._tried for name in learned.names()):
            self._ask(None, {}, learned)

    def _ask(
        self, conn: Connection | None, config: dict[str, Any], learned: Learned | None, mark: int = -1
    ) -> int | None:
        """One request: the modules to import first, then a fork on ``conn``
        (None: no fork) with its start mark. Returns the forked pid."""
        names = () if learned is None else learned.names()
        new = [name for name in names if name not in self._tried]
        timeout = FORK_TIMEOUT + (2 * WARM_TIMEOUT if new else 0.0)
        try:
            self.requests.send({**config, "warm": names, "fork": conn is not None} if new or conn is None else config)
            if conn is not None:
                reduction.send_handle(self.requests, conn.fileno(), self.pid)
                reduction.send_handle(self.requests, mark, self.pid)
            if not self.requests.poll(timeout):
                # Stopped, or stuck: it must not hold the starter thread (nor the
                # queue's close, which waits for that thread). The next start makes another.
                with contextlib.suppress(OSError):
                    os.kill(self.pid, signal.SIGKILL)
                raise OSError(f"the lane's template (process {self.pid}) did not fork within {timeout:g} s")
            pid, done, dropped = self.requests.recv()
        except (OSError, EOFError):
            if new and learned is not None:  # one of them killed it, or hung
                why = "the template died or hung while it imported the modules new to it"
                learned.drop((name, why) for name in new)
            raise
        self._tried.update(done)
        self._tried.update(name for name, _ in dropped)
        if learned is not None and dropped:
            learned.drop(dropped)
        if pid is None:
            self.retired = True
            raise OSError(f"the lane's template (process {self.pid}) has a thread now: it forks no more")
        return pid or None

    def exit_code(self, pid: int, timeout: float) -> int | None:
        """The exit code the template reported for its child ``pid`` (None:
        the template died first, or said nothing within ``timeout``)."""
        deadline = time.monotonic() + timeout
        reported = self._reported
        while pid not in reported:
            if self._ended:
                return None
            try:
                if not self._exits.poll(max(0.0, deadline - time.monotonic())):
                    return None
                child, code = _EXIT.unpack(self._exits.recv_bytes())
            except (EOFError, OSError):
                self._ended = True
                return None
            reported[child] = code
        return reported.pop(pid)

    def close(self) -> None:
        """Close its request pipe (it exits when it sees that), and reap it."""
        with contextlib.suppress(OSError):
            self.requests.close()
        try:
            self.process.join(5)
            if self.process.exitcode is None:  # stopped, or stuck: it holds no job
                with contextlib.suppress(OSError):
                    os.kill(self.pid, signal.SIGKILL)
                self.process.join()
        finally:
            self._exits.close()
            if self._pidfd is not None:
                os.close(self._pidfd)
            self.process.close()


class TemplateChild:
    """The parts of ``multiprocessing.Process`` the supervisor uses, for a
    worker forked by a template."""

    #: Its sentinel is a pidfd of procq's, closed with its channel (``ProcessChannel.release``).
    sentinel_is_ours = True

    def __init__(self, template: Template, pid: int) -> None:
        self.template = template
        self.pid = pid
        self.sentinel = pidfd(pid)
        self.exitcode: int | None = None
        self._joined = False

    def join(self) -> None:
        if not self._joined:  # (its death was seen: the template reaps it at once)
            self._joined = True
            self.exitcode = self.template.exit_code(self.pid, EXIT_REPORT_TIMEOUT)

    def close(self) -> None:
        pass


class LaneTemplates(list[Template]):
    """A lane's templates, the live one last, and the modules its jobs
    needed (``learned``: see ``_worker.warm``)."""

    def __init__(self, lane: str) -> None:
        super().__init__()
        self.learned = Learned(lane)


def lane_templates(templates: dict[str, Any], lane: str) -> LaneTemplates:
    """What a queue keeps for a trusted lane's templates (made on first use; any thread)."""
    kept: LaneTemplates = templates.setdefault(lane, LaneTemplates(lane))
    return kept


def template_for(
    templates: dict[str, Any], lane: str, context: Any, name: str, config: dict[str, Any], init: WorkerInit | None
) -> Template:
    """The lane's live template (starter thread): made on first use, and made
    again when the last one died or retired. A dead one is kept in the list until the
    queue stops: the I/O thread may still read the exit codes it reported."""
    kept = lane_templates(templates, lane)
    if kept and kept[-1].alive():
        return kept[-1]
    template = Template(context, name, config, init)
    kept.append(template)
    return template


# --- the template process ------------------------------------------------------


def template_main(
    requests: Connection, exits: Connection, config: dict[str, Any], init: WorkerInit | None = None
) -> None:
    """The template's loop (see the module docstring). ``init``: the lane's
    initializer, which the template keeps (with the descriptors its arguments
    hold) and each worker it forks runs."""
    from procq._system.privileges import set_dumpable, set_pdeathsig
    from procq._worker.parent import drop_forkserver_alive_fd, parent_process
    from procq._worker.trusted import _boot, setup

    # Never traceable, whatever the lane: it runs no job, and a process that
    # could trace it could subvert every worker it forks from now on (the
    # supervisor may open an untrusted lane later). Each worker sets its own.
    set_dumpable(False)
    _boot()  # SIGINT ignored; its own session
    parent = parent_process()
    sentinel = parent.sentinel
    # Only what the template needs; a worker's own settings are applied in
    # each worker, from the request (they may have changed since).
    keep = {requests.fileno(), exits.fileno(), sentinel}
    if init is not None:
        from procq._worker.initializer import init_fds

        keep |= init_fds()
    setup({}, keep)
    drop_forkserver_alive_fd()
    with contextlib.suppress(Exception):
        set_pdeathsig()  # dies with the forkserver, its parent
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    tried: set[str] = set()  # learned modules imported or dropped here
    threaded = False  # a module started a thread here: fork no more
    poller = select.poll()
    for fd in (requests.fileno(), sentinel, wake_r):
        poller.register(fd, select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd == sentinel:
                os._exit(0)  # the supervisor died; its workers follow (their sentinel, their parent)
            if fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 4096):
                        pass
                _reap(exits)
            elif fd == requests.fileno():
                try:
                    worker_config = requests.recv()
                    forks = worker_config.pop("fork", True)
                    conn_fd = reduction.recv_handle(requests) if forks else -1
                    mark_fd = reduction.recv_handle(requests) if forks else -1
                except (EOFError, OSError):
                    os._exit(0)  # the queue is closing
                done: list[str] = []
                dropped: list[tuple[str, str]] = []
                if not threaded:
                    done, dropped, threaded = import_learned(worker_config.pop("warm", ()), tried)
                if threaded or conn_fd < 0:  # (see _worker.warm: a process with threads must not fork)
                    if conn_fd >= 0:
                        os.close(conn_fd)
                        os.close(mark_fd)
                    requests.send((None if threaded else 0, done, dropped))
                    continue
                me = os.getpid()
                pid = os.fork()
                if pid == 0:
                    _child(conn_fd, mark_fd, worker_config, sentinel, me, (requests, exits), (wake_r, wake_w), init)
                os.close(conn_fd)
                os.close(mark_fd)
                requests.send((pid, done, dropped))


def _reap(exits: Connection) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        with contextlib.suppress(OSError):
            exits.send_bytes(_EXIT.pack(pid, os.waitstatus_to_exitcode(status)))


def _child(
    conn_fd: int,
    mark_fd: int,
    config: dict[str, Any],
    sentinel: int,
    template: int,
    conns: tuple[Connection, ...],
    fds: tuple[int, ...],
    init: WorkerInit | None,
) -> None:
    """A forked worker: it never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for conn in conns:
            conn.close()
        for fd in fds:
            os.close(fd)
        from procq._wire.startmark import open_mark
        from procq._worker.trusted import forked_worker

        forked_worker(Connection(conn_fd), config, sentinel, template, init, open_mark(mark_fd))
        code = 0
        from multiprocessing import util

        util._exit_function()  # type: ignore[attr-defined] # as a multiprocessing child ends: its finalizers
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
