"""An untrusted lane's worker channel: what such a worker sends is never trusted.

An untrusted worker is a fresh ``python -I`` (``_worker.untrusted``) that
forks a process per job and relays that process's JSON answer, marked as the
job's, then reports the process's exit: the job is settled at the exit, with
the answer it gave or as a crash. Every message is read by a non-blocking
``FrameReader`` (a worker that wrote half a message and stopped stalls
nothing) and checked by ``decode_untrusted`` and here; anything out of place
is a ``Violation`` that fails only that worker's job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from procq._core.channel import Launch
from procq._model.values import Completed, Failed, Failure
from procq._supervisor.channels import KINDS, ProcessChannel
from procq._supervisor.egress import close_proxy, open_gate, tell, with_refusals
from procq._supervisor.failures import exit_failure, sandbox_memory_failure, unstarted_failure
from procq._supervisor.output import OutputRelay, Stream
from procq._system import cgroups
from procq._system.processes import ExecProcess, find_descendants, import_path, process_pss, worker_config
from procq._system.sandbox import sandbox_config
from procq._wire.protocol import (
    CUT_SHORT,
    FROM_JOB,
    FROM_WORKER,
    DecodeLater,
    Event,
    FrameReader,
    JobError,
    JobExit,
    JobOutput,
    ProtocolError,
    Ready,
    Report,
    Violation,
    decode_untrusted,
)
from procq._wire.startmark import StartMark, Unstarted

if TYPE_CHECKING:
    from procq._core.core import Core
    from procq._core.entries import Entry, LaneState, WorkerSlot
    from procq._system.egress_proxy import Gate

__all__ = ["INLINE_JSON_BYTES", "MESSAGE_SLACK", "UntrustedChannel", "decode_job_message", "json_values"]

#: Room an untrusted worker's message may take beyond ``max_result_bytes``:
#: an error's traceback text, the JSON around a result.
MESSAGE_SLACK = 1 << 20
#: A job's message longer than this is counted and decoded by the lane's
#: decode thread, not the I/O thread (even counting 16 MiB takes tens of ms,
#: and decoding it far more).
INLINE_JSON_BYTES = 1 << 16

_WHAT = {Ready: "a READY message", JobExit: "an exit message", JobOutput: "a result", JobError: "an error message"}


def json_values(frame: bytes, end: int) -> int:
    """At least as many values as the JSON text ``frame[:end]`` can decode
    to, counted without decoding it: every value but the first follows a
    comma, a colon or an opening bracket or brace. (Those inside strings
    count too: it errs high, never low.) ``bytes.count`` runs at C speed."""
    return (
        1
        + frame.count(b",", 0, end)
        + frame.count(b":", 0, end)
        + frame.count(b"[", 0, end)
        + frame.count(b"{", 0, end)
    )


def _too_many(key: str, lane: str, values: int, limit: int, pid: int) -> Failed:
    return Failed(
        Failure(
            "protocol",
            f"the answer of job {key!r} may hold about {values:,} JSON values (counted before decoding it), more "
            f"than lane {lane!r}'s max_result_values of {limit:,}; it was not decoded",
            pid=pid,
        )
    )


class TooMany(NamedTuple):
    """A job's message that may hold more JSON values than its lane allows (not decoded)."""

    values: int


#: What decoding a job's message came to: the message, a breach of the protocol, or too many values.
Decoded = Ready | JobOutput | JobError | JobExit | ProtocolError | TooMany


def decode_job_message(frame: bytes, max_values: int) -> tuple[int, Decoded]:
    """Count, then decode, a frame from a job's process (on the lane's decode
    thread for a large one): its body's size, and what it decodes to. Never raises."""
    end = len(frame) - 1
    values = json_values(frame, end)
    if values > max_values:
        return end, TooMany(values)
    try:
        return end, decode_untrusted(frame[:end])
    except ProtocolError as exc:
        return end, exc
    except BaseException as exc:  # pragma: no cover - decode_untrusted catches what json raises
        return end, ProtocolError(f"a message that could not be decoded ({type(exc).__name__})")


class UntrustedChannel(ProcessChannel):
    #: Its job's memory counts from the job's sending (the job's process unmaps the start mark).
    COUNTS_FROM_START = False
    #: A job frame larger than this is sent from a thread of its own: a worker
    #: that stops reading its pipe can then stall nothing else.
    inline_limit = 1 << 16

    def __init__(
        self, process: Any, conn: Any, reader: FrameReader, max_result: int | None, max_values: int,
        mark: StartMark | None = None,
    ) -> None:  # fmt: skip
        super().__init__(process, conn, process.sentinel, reader, mark)
        self._max_result = max_result
        self._max_values = max_values
        # The answer the running job's process sent, kept until the worker
        # reports that process's exit (an answer counts only then).
        self._answer: Completed[Any] | Failed | None = None
        # While a message is decoded on the decode thread (see DecodeLater):
        # what was read after it, checked once it is back. None otherwise.
        self._later: list[bytes | bytearray | Violation] | None = None
        self.sandboxed = False
        # The worker's cgroups (``_system.cgroups``), removed once it is reaped.
        self.cgroups: list[str] = []
        # A lane with a network allow-list: this worker's way out (see _system.egress_proxy).
        self.gate: Gate | None = None
        self.lane: LaneState | None = None  # (with a gate: where its jobs' refusals are told)
        # The relay of its stdout and stderr, and their streams (released once it is reaped).
        self.output: tuple[OutputRelay, list[Stream]] | None = None

    @classmethod
    def start(cls, lane: LaneState, launch: Launch) -> UntrustedChannel:
        """A fresh interpreter (``python -I``): it inherits no memory, no
        descriptor but its pipe and the liveness pipe, and only the
        environment the lane gives it."""
        spec = lane.spec
        parent_conn, child_conn = launch.context.Pipe(duplex=True)
        env = dict(os.environ) if spec.inherit_env else {}
        env.update(spec.env or {})
        config = worker_config(spec)
        config["sandbox"] = sandbox_config(spec.sandbox, spec)  # type: ignore[arg-type]  # a Sandbox or None once made
        made = _make_cgroups(config["sandbox"])
        gate, bridge = open_gate(lane, launch, config["sandbox"])
        code = (
            "import sys, json; sys.path[:0] = json.loads(sys.argv[4]); "
            "from procq._worker.untrusted import exec_main; exec_main()"
        )
        # (Its jobs' processes say which job they start: see _wire.startmark.)
        mark = StartMark.create()
        passed = [child_conn.fileno(), launch.alive_fd]
        passed += [] if bridge is None else [bridge.fileno()]
        passed += [] if mark is None else [mark.fileno()]
        # Its stdout and stderr: pipes the lane's relay reads, never the supervisor's own (a terminal, say).
        relay = _relay(lane, launch)
        out_w, out = relay.open(1)
        err_w, err = relay.open(2)
        argv = [
            sys.executable,
            "-I",
            "-c",
            code,
            json.dumps(config),
            str(child_conn.fileno()),
            str(launch.alive_fd),
            json.dumps(import_path()),
            str(-1 if mark is None else mark.fileno()),
        ]
        try:
            popen = subprocess.Popen(
                argv,
                env=env,
                cwd=spec.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                close_fds=True,
                pass_fds=passed,
                start_new_session=True,
            )
        except BaseException:
            parent_conn.close()
            if mark is not None:
                mark.close()
            cgroups.remove(made)
            if gate is not None:
                gate.close()
            relay.release([out, err])
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
            child_conn.close()
            if mark is not None:
                mark.close_fd()
            if bridge is not None:
                bridge.close()
        process = ExecProcess(popen)
        limit = (spec.max_result or 0) + MESSAGE_SLACK
        what = f"the lane's max_result_bytes of {spec.max_result}"
        reader = FrameReader(parent_conn.fileno(), limit, what, trailer=len(FROM_WORKER))
        channel = cls(process, parent_conn, reader, spec.max_result, spec.max_result_values, mark)
        channel.sandboxed = spec.sandbox is not None
        channel.cgroups = made
        channel.gate = gate
        channel.lane = lane if gate is not None else None
        channel.output = (relay, [out, err])
        return channel

    def reap(self) -> int | None:
        """Reap the worker, then remove its cgroups: with it went every
        process of its jobs (the PID 1 of their namespace). Those still
        exiting are waited for on the cgroups' own thread, not this one."""
        exitcode = super().reap()
        if self.cgroups:
            made, self.cgroups = self.cgroups, []
            cgroups.remove_soon(made)
        if self.output is not None:
            relay, streams = self.output
            self.output = None
            relay.release(streams)
        return exitcode

    @classmethod
    def close_lane(cls, lane: LaneState, launch: Launch) -> None:
        close_proxy(lane, launch)
        kept = launch.lanes.get(lane.name)
        relay = kept.pop(_OUTPUT, None) if isinstance(kept, dict) else None
        if relay is not None:
            relay.close()  # what its workers printed last, written out
        # Every worker is reaped: the cgroups still being removed go before
        # close() returns (bounded, as a removal on this thread would be).
        cgroups.settle()

    def send_job(self, core: Core, worker: WorkerSlot, entry: Entry) -> None:
        # An untrusted worker is never sent a job ahead of the one it runs
        # (Dispatch._top_up): the job sent is the one its connections are from.
        if self.gate is not None:
            self.gate.begin(entry.key)
        super().send_job(core, worker, entry)

    def close(self) -> None:
        super().close()
        if self.gate is not None:
            held = self.gate.close()
            if held is not None and self.lane is not None:  # a job killed with its worker: its refusals still told
                tell(self.lane, *held)

    def memory_base(self) -> int:
        """A sandboxed worker is two processes: the one started here, which
        waits outside the namespaces, and the worker (see ``_system.sandbox_linux``)."""
        if not self.sandboxed:
            return super().memory_base()
        return sum(process_pss(pid) for pid in [self.pid, *(p.pid for p in find_descendants(self.pid))])

    def read(self, worker: WorkerSlot) -> list[Event]:
        frames: list[bytes | bytearray | Violation]
        try:
            frames = list(self._reader.read())
        except ProtocolError as exc:
            frames = [Violation(str(exc))]
        if self._later is not None:  # a message is being decoded: these wait for it
            self._later += frames
            return []
        return self._events(worker, frames)

    def resume(self, worker: WorkerSlot, decoded: Any) -> list[Event]:
        """A job's large message is decoded (``decode_job_message``): check
        it, then what was read after it."""
        later, self._later = self._later or [], None
        size, message = decoded
        event = self._checked(worker, message, True, size)
        if event is None:
            return self._events(worker, later)
        if type(event) is Violation:
            return [event]
        return [event, *self._events(worker, later)]

    def _events(self, worker: WorkerSlot, frames: list[bytes | bytearray | Violation]) -> list[Event]:
        events: list[Event] = []
        for i, frame in enumerate(frames):
            event = frame if type(frame) is Violation else self._check(worker, frame)  # type: ignore[arg-type]
            if event is None:
                continue
            events.append(event)
            if type(event) is Violation:
                break
            if type(event) is DecodeLater:
                self._later = frames[i + 1 :]
                break
        return events

    def _check(self, worker: WorkerSlot, frame: bytes | bytearray) -> Event | None:
        """Check one frame. Its last byte says who wrote it: the worker (READY,
        a job's exit) or the job's process (its answer; see ``_wire.protocol``).
        What a job's process sends may be built to cost far more decoded than
        sent: its JSON values are counted first (``json_values``), and a large
        message is counted and decoded on the lane's decode thread
        (``DecodeLater``)."""
        origin = frame[-1:]
        if origin == CUT_SHORT:
            return Violation("a message cut short (the job's process ended partway through writing it)")
        if origin not in (FROM_WORKER, FROM_JOB):
            return Violation(f"a message of unknown origin {origin!r}")
        size = len(frame) - 1
        from_job = origin == FROM_JOB
        if from_job:
            if size > INLINE_JSON_BYTES:
                return DecodeLater(partial(decode_job_message, bytes(frame), self._max_values))
            values = json_values(bytes(frame), size)
            if values > self._max_values:
                return self._checked(worker, TooMany(values), True, size)
        try:
            message = decode_untrusted(bytes(memoryview(frame)[:-1]))
        except ProtocolError as exc:
            return Violation(str(exc))
        return self._checked(worker, message, from_job, size)

    def _checked(self, worker: WorkerSlot, message: Decoded, from_job: bool, size: int) -> Event | None:
        """Act on one decoded message (of ``size`` bytes). A job ends (a
        ``Report``) when the worker reports its process's exit, with the
        answer it gave, or as a crash if none; an answer is kept until then
        (None)."""
        if type(message) is ProtocolError:
            return Violation(str(message))
        held = worker.entry
        if type(message) is TooMany:
            if held is None:
                return Violation("a message from a job's process while it held no job")
            if self._answer is not None:
                return Violation(f"a second answer for job {held.key!r}")
            self._answer = _too_many(held.key, worker.lane.name, message.values, self._max_values, self.pid)
            return None
        if from_job != (type(message) is JobOutput or type(message) is JobError):
            return Violation(f"{_WHAT[type(message)]} written by {'the job' if from_job else 'the worker itself'}")
        if isinstance(message, Ready):
            return message
        assert not isinstance(message, (ProtocolError, TooMany))
        if held is None or held.job_id != message.job_id:
            what = "while it held no job" if held is None else f"while it held job {held.key!r}"
            return Violation(f"a message about job id {message.job_id} {what}")
        if type(message) is JobExit:
            return self._exited(worker, held, message)
        if self._answer is not None:
            return Violation(f"a second answer for job {held.key!r}")
        if type(message) is JobOutput:
            limit = self._max_result
            if limit is not None and size > limit:
                return Violation(f"a result of {size} bytes, more than the lane's max_result_bytes of {limit}")
            self._answer = Completed(message.output)
        else:
            assert type(message) is JobError
            failure = Failure(message.kind, message.message, message.exc_type, message.traceback, pid=self.pid)
            self._answer = Failed(failure)
        return None

    def _exited(self, worker: WorkerSlot, entry: Entry, message: JobExit) -> Report:
        """The process that ran ``entry`` exited: the job ends with its
        answer, or, if it gave none, as a crash (a ``"timeout"`` for SIGXCPU;
        ``"memory"`` when its sandbox's memory cgroup killed it)."""
        outcome, self._answer = self._answer, None
        returncode = message.returncode
        crashed = outcome is None
        if outcome is not None:
            pass
        elif message.memory_killed:
            outcome, crashed = Failed(sandbox_memory_failure(worker, entry, returncode)), False
        elif self.mark is not None and self.mark.started() != entry.job_id:  # it died before the job could start
            who = f"the process forked for job {entry.key!r} by worker {self.pid} of lane {worker.lane.name!r}"
            outcome = Unstarted(unstarted_failure(entry, returncode, who, self.pid))
        else:
            who = f"the process running job {entry.key!r} (forked by worker {self.pid} of lane {worker.lane.name!r})"
            outcome = Failed(exit_failure(returncode, who, self.pid))
        if self.gate is not None:  # what the allow-list refused it, told
            outcome = with_refusals(entry, worker.lane, outcome, self.gate.end())
        return Report(entry.job_id, outcome, False, crashed)


#: Where a lane's output relay is kept in ``Launch.lanes[name]``.
_OUTPUT = "output relay"


def _relay(lane: LaneState, launch: Launch) -> OutputRelay:
    """The relay of what the lane's workers print, made with its first worker."""
    kept = launch.lanes.setdefault(lane.name, {})
    relay: OutputRelay | None = kept.get(_OUTPUT)
    if relay is None:
        relay = kept[_OUTPUT] = OutputRelay(lane.name)
    return relay


def _make_cgroups(config: dict[str, Any] | None) -> list[str]:
    """A new sandboxed worker's cgroups, made as its lane's plan says (their
    directories go into ``config`` for the worker); none for other workers."""
    plan = (config or {}).get("bounds") or {}
    if not plan.get("cgroups"):
        return []
    assert config is not None
    places = {name: cgroups.Place(name, version, parent) for name, (version, parent) in plan["cgroups"].items()}
    dirs = cgroups.make(places, plan["pids_max"], plan["memory_max"])
    plan["cgroup_dirs"] = dirs
    return list(dict.fromkeys(dirs.values()))


KINDS["untrusted"] = UntrustedChannel
