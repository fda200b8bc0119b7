"""The worker: the loop a trusted lane's child runs, and what both kinds share.

A worker takes RUN (one job), RUN_MANY (several, sent ahead) and CANCEL frames
from its own pipe, keeps the jobs in order and runs them one at a time; before
each it takes whatever else has arrived, so a CANCEL for it is seen and the job
skipped (SKIPPED). Each job is reported as it ends: OK or ERROR (see
``call_and_report``). It decides nothing about keys or states, and exits when
its pipe reaches EOF, or (Linux) when its parent dies (``PR_SET_PDEATHSIG``).

Before its first job a worker sets itself up as its lane asks (``setup``: cwd,
environment, resource limits, no descriptors but its pipe and the standard
streams), then sends READY. A trusted lane's worker is a ``multiprocessing``
child (``worker_main``) that runs each job itself and answers in pickles. An
untrusted lane's worker (``_worker.untrusted``, which uses ``setup``,
``call_and_report`` and the JSON codec from here) runs no job code: it forks a
process per job and relays its JSON answer, then its exit (see ``_wire.protocol``).
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import traceback
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from types import TracebackType
from typing import TYPE_CHECKING, Any

from procq._model.job import format_size
from procq._system.privileges import set_dumpable
from procq._system.processes import process_pss
from procq._wire.plain import Parts, result_frame, send_message
from procq._wire.protocol import CANCEL, ERROR, READY, RUN, RUN_MANY, SKIPPED, TRAILER, FnMirror, dumps, json_dumps
from procq._wire.shm_results import MappedFrame, ResultSegments
from procq._wire.startmark import WorkerMark, open_mark
from procq._worker.limits import Limits
from procq._worker.parent import die_with_parent, parent_process
from procq._worker.warm import LEARN, about_to_import, imported_since

if TYPE_CHECKING:
    from procq._worker.initializer import WorkerInit

__all__ = ["worker_main"]


class _Unloadable:
    """Stands in the function cache for a function that failed to unpickle."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _error_fields(exc: BaseException, exc_bytes: bytes | None, note: str = "") -> tuple[Any, ...]:
    """The ERROR message's fields after the job id: pickled exception, type, message, traceback."""
    text = str(exc)
    message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if note:
        message = f"{message} {note}"
    tb = "".join(traceback.format_exception(type(exc), exc, _from_the_job(exc.__traceback__)))
    return (exc_bytes, type(exc).__qualname__, message, tb)


#: The directory of procq's own modules: a traceback's frames there, above the job's, are not shown.
_PROCQ_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _from_the_job(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` from the first frame that is not procq's own (the worker's loop
    that called the job): a failed job's traceback starts with the job's
    frames. One that never left procq (an argument that would not
    unpickle, say) is kept whole."""
    first = tb
    while first is not None and first.tb_frame.f_code.co_filename.startswith(_PROCQ_DIR):
        first = first.tb_next
    return tb if first is None else first


def _pickle_exception(exc: BaseException) -> tuple[bytes | None, str]:
    """Pickle ``exc`` for the supervisor, or say in a note why it cannot travel."""
    try:
        data = dumps(exc)
    except Exception as err:
        return None, f"(the exception could not be pickled to send to the supervisor: {err!r})"
    try:
        pickle.loads(data)  # one that pickles but cannot load is as good as none
    except Exception as err:
        return None, f"(the exception pickles but could not be unpickled again: {err!r})"
    return data, ""


# --- setting up -------------------------------------------------------------


def _rlimit(name: str) -> int:
    import resource

    return {
        "cpu": resource.RLIMIT_CPU,
        "fsize": resource.RLIMIT_FSIZE,
        "nofile": resource.RLIMIT_NOFILE,
        "nproc": resource.RLIMIT_NPROC,
    }[name]


def setup(config: dict[str, Any], keep_fds: set[int]) -> None:
    """Apply the lane's working directory, environment and limits; close
    every inherited descriptor but ``keep_fds`` and the standard streams.

    Limits are set hard (soft and hard alike), so job code cannot raise them,
    except the CPU limit, which counts per job (see ``_worker.limits``).
    """
    if config.get("cwd"):
        os.chdir(config["cwd"])
    if not config.get("inherit_env", True):
        _set_environ(config.get("env") or {})
    elif config.get("environ") is not None:
        _set_environ({**config["environ"], **(config.get("env") or {})})
    elif config.get("env"):
        os.environ.update(config["env"])
    # Before the limits: under a tight "nofile" the listing of /proc/self/fd would fail.
    _close_inherited_fds(keep_fds | {0, 1, 2})
    rlimits = config.get("rlimits") or {}
    if rlimits:
        import resource

        for name, value in rlimits.items():
            if name == "cpu":
                continue
            resource.setrlimit(_rlimit(name), (value, value))
        if "cpu" in rlimits:  # SIGXCPU ends the worker: no core file for it
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _set_environ(wanted: dict[str, str]) -> None:
    """Make the environment ``wanted``, touching only what differs: each
    variable set or unset is a libc call, and a replacement worker's
    environment is usually the one it already has."""
    environ = os.environ
    for name in [name for name in environ if name not in wanted]:
        del environ[name]
    for name, value in wanted.items():
        if environ.get(name) != value:
            environ[name] = value


def _close_inherited_fds(keep: set[int]) -> None:
    """Close every descriptor this process inherited and does not need: job
    code must not reach the supervisor's files, sockets or other pipes."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # pragma: no cover - no /proc: leave them
        return
    for fd in fds:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own descriptor, already closed
    try:  # the resource tracker's pipe was one of them: let a job start its own
        from multiprocessing import resource_tracker

        tracker: Any = resource_tracker._resource_tracker
        tracker._fd = None
        tracker._pid = None
    except Exception:  # pragma: no cover
        pass


# --- running -------------------------------------------------------------


def worker_main(
    conn: Connection,
    lane: str,
    config: dict[str, Any] | None = None,
    init: WorkerInit | None = None,
    mark: WorkerMark | None = None,
) -> None:
    """Run jobs from ``conn`` until EOF. A trusted lane's child's entry point.
    ``mark``: the page in which it says which job it starts (``_wire.startmark``)."""
    parent = parent_process()
    page = open_mark(None if mark is None else mark.fd)
    forked_worker(conn, config or {}, None if parent is None else parent.sentinel, None, init, page)


def forked_worker(
    conn: Connection,
    config: dict[str, Any],
    sentinel: int | None,
    parent: int | None = None,
    init: WorkerInit | None = None,
    mark: memoryview | None = None,
) -> None:
    """Run jobs from ``conn`` until EOF, in a process whose supervisor's death
    ``sentinel`` (a pipe) tells: a ``multiprocessing`` child's (``worker_main``),
    or a child of a lane's template (``_worker.template``), whose pid is
    ``parent``. ``init``: the lane's initializer, run before READY. ``mark``:
    the mapped page in which it stores each job's id as it starts it."""
    # First: a worker forked from procq's forkserver starts untraceable, one
    # started otherwise (spawn, or a forkserver procq did not start) is
    # traceable until here.
    set_dumpable(not config.get("untraceable"))
    _boot()
    keep = {conn.fileno()}
    if init is not None:  # (its module is loaded: init was unpickled from it)
        from procq._worker.initializer import init_fds

        keep |= init_fds()
    if sentinel is not None:
        keep.add(sentinel)
    setup(config, keep)
    die_with_parent(sentinel)
    if parent is not None and os.getppid() != parent:
        # The template died as this worker booted, before PR_SET_PDEATHSIG
        # took effect: no one would report this worker's exit. It ends
        # before READY, as a worker that dies while it starts.
        return
    if init is not None:
        init.run()  # (still booting: one that kills the process is a worker that died as it started)
    codec = _Pickled(_main_fallback(), config.get("shm_prefix"))
    run_until_eof(lambda: _serve(conn, config, codec, init, mark))


def _main_fallback() -> str:
    """Why the forkserver this worker was forked from did not import the
    main module, which this worker then imported itself ("": it did, or
    nothing asked it to: see ``_worker.forkserver_main``)."""
    module = sys.modules.get("procq._worker.forkserver_main")
    why = getattr(module, "fallback", None)
    return f"{why}; each worker imports it again as it starts" if why else ""


def _boot() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's to handle
    if hasattr(signal, "pthread_sigmask"):
        # The supervisor starts workers with SIGINT blocked, so that a Ctrl-C
        # landing while one boots stays pending; now that it is ignored, a
        # pending one is discarded and the mask can be the usual one.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if hasattr(os, "setsid"):
        try:
            os.setsid()  # lead a session, so a job's whole process tree can be killed
        except OSError:  # pragma: no cover - already a group leader
            pass


def run_until_eof(serve: Callable[[], None]) -> None:
    """Run a worker's loop until its pipe is gone, then flush its output."""
    try:
        serve()
    except (BrokenPipeError, ConnectionResetError, EOFError):
        pass  # the supervisor closed our pipe, or died: nothing is left to do
    sys.stdout.flush()
    sys.stderr.flush()


class _Codec:
    """How a worker writes its messages: pickles, then a trailer, for trusted lanes; JSON for untrusted."""

    def ready(self) -> bytes:
        raise NotImplementedError

    def ok(self, job_id: int, result: Any) -> bytes:
        raise NotImplementedError

    def error(self, job_id: int, kind: str, exc: BaseException, note: str = "", pickle_it: bool = False) -> bytes:
        raise NotImplementedError


#: A worker idle this long lets go of the result segments it kept to write again.
_TRIM_AFTER_MS = 1000


class _Pickled(_Codec):
    def __init__(self, note: str = "", shm_prefix: str | None = None) -> None:
        self.note = note  # said with READY: why the main module was imported here, if it was
        # Where its large results go (_wire.shm_results); None: all in the pipe (remote workers).
        self.segments = ResultSegments(shm_prefix) if shm_prefix is not None else None

    def ready(self) -> bytes:
        return self.note.encode("utf-8", "replace") + TRAILER.pack(0, READY)

    def ok(self, job_id: int, result: Any) -> bytes | Parts | MappedFrame:  # type: ignore[override]
        return result_frame(job_id, result, self.segments)

    def error(self, job_id: int, kind: str, exc: BaseException, note: str = "", pickle_it: bool = False) -> bytes:
        exc_bytes = None
        if pickle_it:
            exc_bytes, why = _pickle_exception(exc)
            note = note or why
        return dumps((*_error_fields(exc, exc_bytes, note), kind)) + TRAILER.pack(job_id, ERROR)


class _Json(_Codec):
    def ready(self) -> bytes:
        return json_dumps(["ready"])

    def ok(self, job_id: int, result: Any) -> bytes:
        return json_dumps(["ok", job_id, result])

    def error(self, job_id: int, kind: str, exc: BaseException, note: str = "", pickle_it: bool = False) -> bytes:
        _, exc_type, message, tb = _error_fields(exc, None, note)
        return json_dumps(["error", job_id, kind, exc_type, message, tb])


def _serve(
    conn: Connection,
    config: dict[str, Any],
    codec: _Codec,
    init: WorkerInit | None = None,
    mark: memoryview | None = None,
) -> None:
    recv, send_bytes, fd = conn.recv_bytes, conn.send_bytes, conn.fileno()
    if mark is None:
        mark = memoryview(bytearray(16)).cast("q")  # (no shared page: written all the same, read by no one)

    def send(frame: bytes | Parts | MappedFrame) -> None:
        send_message(fd, send_bytes, frame)

    waiting = select.poll()  # (Connection.poll builds a selector per call)
    waiting.register(conn.fileno(), select.POLLIN)
    run = _Runner(config, codec, send, init)
    todo: deque[tuple[Any, ...]] = deque()  # jobs received, not started, in order
    segments = codec.segments if isinstance(codec, _Pickled) else None
    skip: set[int] = set()  # ids q.cancel() asked us to skip
    send(codec.ready())  # until now a signal could still kill us: no job was at risk
    try:
        while True:
            if not todo:
                if segments is not None and segments.kept():
                    segments.prepare()  # (nothing to do now: map what it will write into next)
                    if not waiting.poll(_TRIM_AFTER_MS):
                        segments.trim()  # idle: the memory of the result segments it kept goes
                _take(recv(), todo, skip)
            # Whatever else has arrived, before the next job starts: a CANCEL
            # for it must be seen now, not after it has run.
            while waiting.poll(0):
                _take(recv(), todo, skip)
            if not todo:
                continue
            job = todo.popleft()
            if job[0] in skip:
                skip.discard(job[0])
                run.skip(*job)
                send(TRAILER.pack(job[0], SKIPPED))
                continue
            if job[4] is not None:  # a memory limit: its memory counts from here (see _wire.startmark)
                if segments is not None:
                    segments.no_mappings()
                mark[1] = process_pss(os.getpid())
            # Started from here on: a death now is this job's (see _wire.startmark).
            mark[0] = job[0]
            run(*job)
    except (EOFError, OSError):
        return


def _take(frame: bytes, todo: deque[tuple[Any, ...]], skip: set[int]) -> None:
    message = pickle.loads(frame)
    tag = message[0]
    if tag == RUN_MANY:  # several jobs, run in order, each reported as it ends
        todo.extend(message[1])
    elif tag == RUN:
        todo.append(message[1:])
    else:
        assert tag == CANCEL
        if len(skip) > 4096:  # ids of jobs that had run already: never seen again
            skip.clear()
        skip.add(message[1])


class _Unread:
    """Stands in the function cache for a function whose bytes came with a job
    that was skipped: unpickled when a later job uses it."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def _load_fn(data: bytes) -> Any:
    try:
        return pickle.loads(data)
    except BaseException as exc:
        return _Unloadable(exc)


class _Runner:
    """Runs one job and sends its outcome: the worker's whole job, per job."""

    def __init__(self, config: dict[str, Any], codec: _Codec, send: Any, init: WorkerInit | None = None) -> None:
        self.init = init
        self.fns = FnMirror()
        self.limits = Limits((config.get("rlimits") or {}).get("cpu"))
        self.max_result: int | None = config.get("max_result_bytes")
        self.learn = bool(config.get(LEARN))  # tell the supervisor what unpickling a job imported
        self.codec = codec
        self.send = send

    def skip(self, job_id: int, fn_id: bytes, fn_bytes: bytes | None, *_: Any) -> None:
        """A job not run: its function still enters the cache, in turn, as the
        supervisor's mirror of it has it (see _protocol.FnMirror)."""
        self.fns.touch(fn_id, None if fn_bytes is None else _Unread(fn_bytes))

    def __call__(
        self, job_id: int, fn_id: bytes, fn_bytes: bytes | None, args_bytes: bytes, memory_limit: int | None
    ) -> None:
        codec, send, fns, loads = self.codec, self.send, self.fns, pickle.loads
        count = len(sys.modules)
        try:
            if fn_bytes is None:
                fn = fns.get(fn_id)
                fns.touch(fn_id)
                if isinstance(fn, _Unread):  # first sent with a job that was skipped
                    fn = _load_fn(fn.data)
                    fns.touch(fn_id, fn)
            else:
                if self.learn:
                    about_to_import(fn_bytes, send)
                fn = _load_fn(fn_bytes)
                fns.touch(fn_id, fn)
            if isinstance(fn, _Unloadable):
                raise fn.error
            args, kwargs = loads(args_bytes)
        except BaseException as exc:
            note = "(the job's function or arguments could not be unpickled in the worker)"
            send(codec.error(job_id, "error", exc, note))
            return
        if len(sys.modules) != count and self.learn:
            imported_since(count, send)
        if self.init is not None:
            failed = self.init.check()
            if failed is not None:
                send(codec.error(job_id, "error", failed, pickle_it=True))
                return
        limits = self.limits
        # Held by the call alone, let go as it returns: arguments mapped from shared
        # memory are unmapped before the result is sent, their segment free to reuse.
        held = [args, kwargs]
        del args, kwargs

        def call() -> Any:
            args, kwargs = held
            held.clear()
            limits.apply(memory_limit)
            try:
                return fn(*args, **kwargs) if kwargs else fn(*args)
            finally:
                limits.lift()

        call_and_report(codec, send, job_id, call, memory_limit, self.max_result, "pickled")


def call_and_report(
    codec: _Codec,
    send: Callable[[bytes], None],
    job_id: int,
    call: Callable[[], Any],
    memory_limit: int | None,
    max_result: int | None,
    encoding: str,
) -> None:
    """Run a job (``call``) and send how it ended: its result, its exception
    (``MemoryError``: kind "memory"), a result that would not encode, or one
    larger than ``max_result``. Both workers' way to end a job."""
    try:
        result = call()
    except MemoryError as exc:
        note = "" if memory_limit is None else f"(the job went over its memory_limit of {format_size(memory_limit)})"
        send(codec.error(job_id, "memory", exc, note))
        return
    except BaseException as exc:
        send(codec.error(job_id, "error", exc, pickle_it=True))
        return
    try:
        data = codec.ok(job_id, result)
    except BaseException as exc:
        note = f"(the job's result, a {type(result).__name__}, could not be {encoding})"
        # The exception travels too, as the job's own would: what pickling the
        # result raised (a PicklingError, a TypeError, or a SystemExit from a
        # __reduce__) is the cause, as ProcessPoolExecutor hands it back.
        send(codec.error(job_id, "error", exc, note, pickle_it=True))
        return
    del result
    if max_result is not None and len(data) > max_result:
        too_large = ResultTooLarge(
            f"the job's result is {len(data)} bytes, more than the lane's max_result_bytes of {max_result}"
        )
        send(codec.error(job_id, "protocol", too_large))
        return
    send(data)


class ResultTooLarge(Exception):
    """A result larger than the lane allows (reported, never raised to a caller)."""
