"""An untrusted lane's worker channel: what such a worker sends is never trusted.

An untrusted worker is a fresh ``python -I`` (``_worker_untrusted``) that
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
from typing import TYPE_CHECKING, Any

from procq._channel import Launch, ProcessChannel
from procq._processes import ExecProcess, describe_exit, import_path, worker_config
from procq._protocol import (
    CUT_SHORT,
    FROM_JOB,
    FROM_WORKER,
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
from procq._values import Completed, Failed, Failure

if TYPE_CHECKING:
    from procq._entries import Entry, LaneState, WorkerSlot

__all__ = ["MESSAGE_SLACK", "UntrustedChannel"]

#: Room an untrusted worker's message may take beyond ``max_result_bytes``:
#: an error's traceback text, the JSON around a result.
MESSAGE_SLACK = 1 << 20

_WHAT = {Ready: "a READY message", JobExit: "an exit message", JobOutput: "a result", JobError: "an error message"}


class UntrustedChannel(ProcessChannel):
    #: A job frame larger than this is sent from a thread of its own: a worker
    #: that stops reading its pipe can then stall nothing else.
    inline_limit = 1 << 16

    def __init__(self, process: Any, conn: Any, reader: FrameReader, max_result: int | None) -> None:
        super().__init__(process, conn, process.sentinel, reader)
        self._max_result = max_result
        # The answer the running job's process sent, kept until the worker
        # reports that process's exit (an answer counts only then).
        self._answer: Completed[Any] | Failed | None = None

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
        code = (
            "import sys, json; sys.path[:0] = json.loads(sys.argv[4]); "
            "from procq._worker_untrusted import exec_main; exec_main()"
        )
        argv = [
            sys.executable, "-I", "-c", code,
            json.dumps(config), str(child_conn.fileno()), str(launch.alive_fd), json.dumps(import_path()),
        ]
        try:
            popen = subprocess.Popen(
                argv,
                env=env,
                cwd=spec.cwd,
                stdin=subprocess.DEVNULL,
                close_fds=True,
                pass_fds=(child_conn.fileno(), launch.alive_fd),
                start_new_session=True,
            )
        except BaseException:
            parent_conn.close()
            raise
        finally:
            child_conn.close()
        process = ExecProcess(popen)
        limit = (spec.max_result or 0) + MESSAGE_SLACK
        what = f"the lane's max_result_bytes of {spec.max_result}"
        reader = FrameReader(parent_conn.fileno(), limit, what, trailer=len(FROM_WORKER))
        return cls(process, parent_conn, reader, spec.max_result)

    def read(self, worker: WorkerSlot) -> list[Event]:
        try:
            frames = self._reader.read()
        except ProtocolError as exc:
            return [Violation(str(exc))]
        events: list[Event] = []
        for frame in frames:
            event = self._check(worker, frame)
            if event is not None:
                events.append(event)
                if type(event) is Violation:
                    break
        return events

    def _check(self, worker: WorkerSlot, frame: bytes | bytearray) -> Event | None:
        """Check one frame. Its last byte says who wrote it: the worker (READY,
        a job's exit) or the job's process (its answer; see ``_protocol``). A
        job ends (a ``Report``) when the worker reports its process's exit,
        with the answer it gave, or as a crash if none; an answer is kept
        until then (None)."""
        body, origin = memoryview(frame)[:-1], frame[-1:]
        try:
            if origin == CUT_SHORT:
                raise ProtocolError("a message cut short (the job's process ended partway through writing it)")
            if origin not in (FROM_WORKER, FROM_JOB):
                raise ProtocolError(f"a message of unknown origin {origin!r}")
            message = decode_untrusted(bytes(body))
        except ProtocolError as exc:
            return Violation(str(exc))
        from_job = origin == FROM_JOB
        if from_job != (type(message) is JobOutput or type(message) is JobError):
            return Violation(f"{_WHAT[type(message)]} written by {'the job' if from_job else 'the worker itself'}")
        if isinstance(message, Ready):
            return message
        held = worker.entry
        if held is None or held.job_id != message.job_id:
            what = "while it held no job" if held is None else f"while it held job {held.key!r}"
            return Violation(f"a message about job id {message.job_id} {what}")
        if type(message) is JobExit:
            return self._exited(worker, held, message.returncode)
        if self._answer is not None:
            return Violation(f"a second answer for job {held.key!r}")
        if type(message) is JobOutput:
            limit = self._max_result
            if limit is not None and len(body) > limit:
                return Violation(f"a result of {len(body)} bytes, more than the lane's max_result_bytes of {limit}")
            self._answer = Completed(message.output)
        else:
            assert type(message) is JobError
            failure = Failure(message.kind, message.message, message.exc_type, message.traceback, pid=self.pid)
            self._answer = Failed(failure)
        return None

    def _exited(self, worker: WorkerSlot, entry: Entry, returncode: int) -> Report:
        """The process that ran ``entry`` exited: the job ends with its
        answer, or as a crash (a ``"timeout"`` for SIGXCPU) if it gave none."""
        outcome, self._answer = self._answer, None
        if outcome is not None:
            return Report(entry.job_id, outcome, False, False)
        sig, how, cause = describe_exit(returncode)
        explained = "" if not cause else f": {cause}" if sig else f" ({cause})"
        failure = Failure(
            "timeout" if sig == "SIGXCPU" else "crashed",
            f"the process running job {entry.key!r} (forked by worker {self.pid} of lane "
            f"{worker.lane.name!r}) {how}{explained}",
            exitcode=returncode,
            signal=sig,
            pid=self.pid,
        )
        return Report(entry.job_id, Failed(failure), False, True)
