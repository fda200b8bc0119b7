"""A trusted lane's worker channel: a ``multiprocessing`` child (``_worker.trusted``)
that runs each job itself and answers in pickles.

Its answers are read in bulk: every frame that has arrived is taken in one
read (a large one read whole at once). Each message's trailer says which job
it is about (see ``_wire.protocol``), so a payload that fails to decode fails that
job alone. Unpickling a payload may run code of the job's classes
(``__reduce__``, ``__setstate__``: it may raise ``SystemExit``, hang, ...), so
the I/O thread unpickles only what runs none:

- a result whose pickle names no class or function (``_wire.plain.names_nothing``: no
  ``GLOBAL``, ``STACK_GLOBAL``, ``INST`` or ``EXT1/2/4`` opcode, without
  which no opcode that calls something can run). The worker that made the
  pickle scans it (at C speed, in parallel with the supervisor, on the
  pickle alone) and tags the result ``OK``; ``pickle.loads`` then runs as
  before. A result tagged ``OK_OBJECTS`` is never unpickled here;
- an error's fields (plain data) and a built-in exception type, decoded by
  ``_wire.plain.DataOnly``, an unpickler that refuses to name any class or function
  (``BuiltinExceptions``: only the built-in exception types, made and set up
  by C code alone), after the same scan.

The rest, and any payload larger than ``INLINE_DECODE_BYTES``, is left
``Undecoded`` for the lane's decode thread, which unpickles it with plain
``pickle`` (see ``_supervisor.decode``). The reports decoded here are settled
together in one ``Core.jobs_done``, as before.

A result whose large buffers came through a shared-memory segment
(``OK_MAPPED``, see ``_wire.shm``) is mapped here, as its message is read,
and the segment's name removed at once: from then on its memory lives as long
as the result's objects (or the ``Undecoded`` holding the mapping), whatever
becomes of the job. Reaping a worker removes any segment it wrote and never
sent (``sweep``).
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import pickle
import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from procq._core.channel import Launch
from procq._model.errors import JobPicklingError, _RemoteTraceback
from procq._model.values import Completed, Failed, Failure, FailureKind
from procq._supervisor.channels import KINDS, ProcessChannel, on_starter_thread
from procq._supervisor.log import main_not_preloaded
from procq._system.processes import pidfd, worker_config
from procq._wire.plain import BuiltinExceptions, NeedsCode, load_data
from procq._wire.protocol import (
    ERROR,
    IMPORTED,
    OK,
    OK_MAPPED,
    OK_OBJECTS,
    READY,
    SKIPPED,
    TRAILER,
    Event,
    FrameReader,
    Ready,
    Report,
    Undecoded,
    Violation,
)
from procq._wire.shm import segment_prefix, sweep
from procq._wire.shm_results import map_result
from procq._wire.startmark import StartMark
from procq._worker.template import Template, lane_templates, template_for
from procq._worker.trusted import worker_main
from procq._worker.warm import LEARN, Learned

if TYPE_CHECKING:
    from procq._core.entries import LaneState, WorkerSlot

__all__ = ["INLINE_DECODE_BYTES", "TrustedChannel", "describe_error", "error_report", "result_outcome"]

#: A trusted worker's messages have no size limit but the format's.
TRUSTED_LIMIT = 1 << 62
#: Payloads larger than this are always decoded by the lane's decode thread:
#: even plain data takes long to unpickle when there is much of it.
INLINE_DECODE_BYTES = 1 << 24

_READY = Ready()
_TRAILER_SIZE = TRAILER.size


def describe_error(exc: BaseException) -> str:
    """``exc`` for a message, even when its own ``__repr__`` fails."""
    try:
        return repr(exc)
    except BaseException:
        return f"<{type(exc).__qualname__}>"


def _result_failure(exc: BaseException, pid: int | None) -> Failed:
    """The job's result could not be unpickled here: what unpickling it raised,
    and where (the traceback, as a worker's error carries its own)."""
    try:
        tb = "".join(traceback.format_exception(exc))
    except BaseException:
        tb = None
    return Failed(
        Failure(
            "error",
            f"the job's result could not be unpickled in the supervisor: {describe_error(exc)}",
            exc_type=type(exc).__qualname__,
            traceback=tb,
            pid=pid,
        )
    )


class PickledResult(Undecoded):
    """A result to unpickle on the lane's decode thread."""

    __slots__ = ("data", "pid")

    def __init__(self, data: bytes | bytearray, pid: int | None) -> None:
        self.data = data
        self.pid = pid

    def decode(self) -> Completed[Any] | Failed:
        try:
            return Completed(pickle.loads(self.data))
        except BaseException as exc:  # SystemExit, KeyboardInterrupt: the job's alone
            return _result_failure(exc, self.pid)


class MappedResult(Undecoded):
    """A result whose buffers are views of a mapped segment, to unpickle on
    the lane's decode thread (its numpy arrays are views of the mapping)."""

    __slots__ = ("buffers", "data", "pid")

    def __init__(self, data: bytes, buffers: list[memoryview], pid: int | None) -> None:
        self.data = data
        self.buffers = buffers
        self.pid = pid

    def decode(self) -> Completed[Any] | Failed:
        try:
            return Completed(pickle.loads(self.data, buffers=self.buffers))
        except BaseException as exc:  # SystemExit, KeyboardInterrupt: the job's alone
            return _result_failure(exc, self.pid)
        finally:
            self.buffers = []


def _mapped_result(frame: bytes | bytearray, prefix: str, pid: int) -> MappedResult | Failed:
    """An OK_MAPPED message: its segment mapped (``map_result``: given back
    to the worker as the mapping goes, or its name removed now). The name
    must be one this worker may write (``prefix``): a trusted worker's
    message is believed, but never to remove or write another file."""
    try:
        name, spans, token, data = load_data(frame)
        if type(name) is not str or not name.startswith(prefix) or not name[len(prefix) :].replace("-", "").isdigit():
            raise ValueError(f"a segment name that is not this worker's: {name!r}")
        buffers = map_result(name, spans, token)
    except Exception as exc:
        failure = Failure("error", f"the job's result could not be read from shared memory: {exc!r}", pid=pid)
        return Failed(failure)
    return MappedResult(data, buffers, pid)


class _Raised:
    """What an ERROR message says of a job's exception, but the exception itself."""

    __slots__ = ("exc_type", "kind", "pid", "tb", "text")

    def __init__(self, kind: FailureKind, exc_type: str, text: str, tb: str, pid: int | None) -> None:
        self.kind = kind
        self.exc_type = exc_type
        self.text = text
        self.tb = tb
        self.pid = pid

    def failed(self, exception: BaseException | None = None, note: str = "") -> Failed:
        text = f"{self.text} {note}" if note else self.text
        return Failed(Failure(self.kind, text, self.exc_type, self.tb, pid=self.pid, exception=exception))

    def with_exception(self, exception: Any) -> Failed:
        if not isinstance(exception, BaseException):
            return self.failed(note="(the exception came back as something else)")
        exception.__cause__ = _RemoteTraceback(self.tb)
        return self.failed(exception)

    def unloadable(self, exc: BaseException) -> Failed:
        return self.failed(note=f"(the exception could not be unpickled in the supervisor: {describe_error(exc)})")


class PickledError(Undecoded):
    """A job's exception to unpickle on the lane's decode thread."""

    __slots__ = ("data", "raised")

    def __init__(self, data: bytes, raised: _Raised) -> None:
        self.data = data
        self.raised = raised

    def decode(self) -> Completed[Any] | Failed:
        try:
            exception = pickle.loads(self.data)
            return self.raised.with_exception(exception)
        except BaseException as exc:
            return self.raised.unloadable(exc)


class TrustedChannel(ProcessChannel):
    #: Where the modules its jobs needed are learned (``_worker.warm``): its
    #: lane's, where templates fork; None where they do not.
    learned: Learned | None = None

    @classmethod
    def start(cls, lane: LaneState, launch: Launch) -> TrustedChannel:
        """One of the queue's first workers: a ``multiprocessing`` child,
        through the forkserver (or spawn). A replacement or a spare (a start
        on the starter thread) under the forkserver: forked by the lane's
        template (``_fork``)."""
        # (A racy read of boot_failures, the I/O thread's: a hint, not a decision.)
        if on_starter_thread() and _templates_work(launch) and not lane.boot_failures:
            try:
                return cls._fork(lane, launch)
            except (OSError, EOFError):
                # The template could not start or fork: it died as it booted (the
                # main module fails there too, say), or was killed. This start goes
                # through the forkserver, as the first did; a child that fails
                # there shows why, and the lane's count of workers that die while
                # they start sees it.
                pass
        parent_conn, child_conn = launch.context.Pipe(duplex=True)
        init = _initializer(lane)
        mark = StartMark.create()
        learned = _learned(lane, launch) if _templates_work(launch) else None
        try:
            process = launch.context.Process(
                target=worker_main,
                args=(child_conn, lane.name, _config(lane, learned), init, mark and mark.for_child()),
                name=f"procq-worker-{launch.name}-{lane.name}",
                daemon=False,
            )
            with _initializer_pickled(lane):
                process.start()
        except BaseException:
            parent_conn.close()
            if mark is not None:
                mark.close()
            raise
        finally:
            child_conn.close()  # the child has its own copy now
            if mark is not None:
                mark.close_fd()
        # Out of multiprocessing's list of children: the I/O thread alone waits
        # for a worker. Process.start() and active_children(), on any thread
        # (the starter's, a caller's), poll every child listed there, and a
        # poll reads the exit status from the forkserver's pipe: it could take
        # one the I/O thread is reaping, or read a descriptor it just closed.
        multiprocessing.process._children.discard(process)  # type: ignore[attr-defined]
        sentinel = pidfd(process.pid)
        if sentinel is None:  # pragma: no cover - no pidfds: multiprocessing's own sentinel
            sentinel = process.sentinel
        reader = FrameReader(parent_conn.fileno(), TRUSTED_LIMIT, wait_whole=True)
        channel = cls(process, parent_conn, sentinel, reader, mark)
        channel.learned = learned
        return channel

    @classmethod
    def _fork(cls, lane: LaneState, launch: Launch) -> TrustedChannel:
        """A replacement or a spare (a start on the starter thread), forked by
        the lane's template (``_worker.template``)."""
        learned = _learned(lane, launch)
        config = _config(lane, learned)
        template = _template(lane, launch, config)
        parent_conn, child_conn = launch.context.Pipe(duplex=True)
        mark = StartMark.create()
        assert mark is not None  # (templates are made only on Linux)
        try:
            process = template.fork(child_conn, config, mark.fileno(), learned)
        except BaseException:
            parent_conn.close()
            mark.close()
            raise
        finally:
            child_conn.close()  # the template's child has its own copy now
            mark.close_fd()
        if process.sentinel is None:  # pragma: no cover - gone before its pidfd was opened
            process.sentinel = _dead_sentinel()
        reader = FrameReader(parent_conn.fileno(), TRUSTED_LIMIT, wait_whole=True)
        channel = cls(process, parent_conn, process.sentinel, reader, mark)
        channel.learned = learned
        return channel

    @classmethod
    def warm(cls, lane: LaneState, launch: Launch) -> None:
        """Have the lane's template (made now if need be) import the modules
        its jobs needed (``_worker.warm``), before the next start asks for one."""
        if not _templates_work(launch) or lane.boot_failures:
            return
        learned = _learned(lane, launch)
        template = _template(lane, launch, _config(lane, learned))
        with contextlib.suppress(OSError, EOFError):  # (a module it dropped is logged; the next start makes another)
            template.warm(learned)

    @classmethod
    def close_lane(cls, lane: LaneState, launch: Launch) -> None:
        """Every worker of the lane is reaped: close and reap its templates."""
        for template in launch.lanes.pop(lane.name, ()):
            template.close()

    leadable = True

    def reap(self) -> int | None:
        # Dead, and not reaped yet (so its pid is no one else's): the
        # segments it wrote and never sent are removed (see _wire.shm).
        sweep(f"{segment_prefix()}w{self.pid}-")
        return super().reap()

    def wait_readable(self, timeout: float) -> bool:
        return self._reader.wait(timeout)

    def read(self, worker: WorkerSlot) -> list[Event]:
        frames = self._reader.read()
        events: list[Event] = []
        new = tuple.__new__  # Report(...) without its Python-level __new__: this is per job
        unpack = TRAILER.unpack_from
        for frame in frames:
            end = len(frame) - _TRAILER_SIZE
            if end < 0:
                events.append(Violation(f"a message of {len(frame)} bytes, too short to say which job it is about"))
                break
            job_id, tag = unpack(frame, end)
            if tag == OK:
                events.append(new(Report, (job_id, result_outcome(frame, end, self.pid), False, False)))
            elif tag == OK_OBJECTS:
                events.append(new(Report, (job_id, PickledResult(frame, self.pid), False, False)))
            elif tag == OK_MAPPED:
                outcome = _mapped_result(frame, f"{segment_prefix()}w{self.pid}-", self.pid)
                events.append(Report(job_id, outcome, False, False))
            elif tag == READY:
                if end:  # the worker imported the main module itself, and says why
                    main_not_preloaded(bytes(frame[:end]).decode("utf-8", "replace"))
                events.append(_READY)
            elif tag == ERROR:
                events.append(error_report(job_id, frame, end, self.pid))
            elif tag == IMPORTED:
                if self.learned is not None:
                    self.learned.learn(frame[:end])
            elif tag == SKIPPED:
                # q.cancel() gave the job its failure already (Core.jobs_done uses it);
                # this one only stands in should that ever not be so.
                failure = Failure("cancelled", f"job id {job_id} was skipped by its worker")
                events.append(Report(job_id, Failed(failure), False, False))
            else:
                events.append(Violation(f"a message with an unknown tag {tag}"))
                break
        return events


def _learned(lane: LaneState, launch: Launch) -> Learned:
    """The lane's learned modules; a new name in them asks the starter to warm its template."""
    learned = lane_templates(launch.lanes, lane.name).learned
    if learned.on_new is None:
        learned.on_new = lambda: [ask(lane) for ask in launch.warmers]
    return learned


def _template(lane: LaneState, launch: Launch, config: dict[str, Any]) -> Template:
    """The lane's live template (starter thread), made if need be."""
    name = f"procq-template-{launch.name}-{lane.name}"
    with _initializer_pickled(lane):
        return template_for(launch.lanes, lane.name, launch.context, name, config, _initializer(lane))


def _config(lane: LaneState, learned: Learned | None) -> dict[str, Any]:
    """A worker's config, with how to name its results' segments; one whose
    lane learns its jobs' modules says so."""
    config = {**worker_config(lane.spec), "shm_prefix": segment_prefix()}
    if learned is not None:
        config[LEARN] = True
    return config


def _initializer(lane: LaneState) -> Any:
    """The lane's initializer, as its workers' starts carry it (a
    ``_worker.initializer.WorkerInit``), or None."""
    spec = lane.spec
    if spec.initializer is None:
        return None
    from procq._worker.initializer import WorkerInit  # (it loads concurrent.futures: only for lanes that need it)

    return WorkerInit(spec.initializer, spec.initargs)


@contextlib.contextmanager
def _initializer_pickled(lane: LaneState) -> Iterator[None]:
    """A worker's start that fails to pickle its arguments: the lane's
    initializer or initargs are the only ones that can fail, so say so."""
    try:
        yield
    # (RuntimeError: a Lock or Queue made from another start method's context.)
    except (pickle.PicklingError, TypeError, AttributeError, RuntimeError) as exc:
        if lane.spec.initializer is None:
            raise
        raise JobPicklingError(
            f"lane {lane.name!r}: its initializer and initargs must be picklable to start its workers (the "
            f"initializer as a job's function is; initargs by multiprocessing as it starts a process, so a "
            f"multiprocessing Queue or Lock made from the queue's start method's context may be one), but: {exc}"
        ) from exc


def _templates_work(launch: Launch) -> bool:
    """Templates fork where workers start through the forkserver, on Linux (pidfds)."""
    return hasattr(os, "pidfd_open") and launch.context.get_start_method() == "forkserver"


def _dead_sentinel() -> int:
    """A descriptor that is readable at once: the sentinel of a worker gone
    before it could be watched (its death is then seen at once)."""
    read, write = os.pipe()
    os.close(write)
    return read


def result_outcome(frame: bytes | bytearray, end: int, pid: int | None) -> Completed[Any] | Failed | Undecoded:
    """An OK message's result, which names no class or function (the
    worker checked the pickle it made: ``_wire.plain.result_frame``): decoded here,
    unless it is large."""
    if end > INLINE_DECODE_BYTES:
        return PickledResult(frame, pid)
    try:
        return Completed(pickle.loads(frame))
    except Exception as exc:  # a broken pickle: decoding it ran nothing, and failed
        return _result_failure(exc, pid)


def error_report(job_id: int, frame: bytes | bytearray, end: int, pid: int | None) -> Report:
    """An ERROR message. Kind "protocol" here: the worker refused to send
    a result over max_result_bytes; it broke nothing and stays. Kind
    "memory": the job went over its memory limit, which leaves a worker
    that may be bloated or half broken (and maybe children): it is replaced.
    Its fields are plain data, decoded here; the exception is decoded here
    only if it is a built-in one."""
    try:
        exc_bytes, exc_type, text, tb, kind = load_data(frame)
    except Exception as exc:  # our own worker wrote it: only a broken pipe does this
        failure = Failure("error", f"the job's error could not be decoded in the supervisor: {exc!r}", pid=pid)
        return Report(job_id, Failed(failure), False, False)
    raised = _Raised(kind, exc_type, text, tb, pid)
    outcome: Completed[Any] | Failed | Undecoded
    if exc_bytes is None:
        outcome = raised.failed()
    else:
        outcome = PickledError(exc_bytes, raised)
        if len(exc_bytes) <= INLINE_DECODE_BYTES:
            try:
                outcome = raised.with_exception(load_data(exc_bytes, BuiltinExceptions))
            except NeedsCode:
                pass
            except Exception as exc:
                outcome = raised.unloadable(exc)
    return Report(job_id, outcome, kind == "memory", False)


KINDS["trusted"] = TrustedChannel
