"""The supervisor's side of untrusted lanes: starting their workers, and
reading what they send, which is never trusted.

A mixin of ``Supervisor`` (``_supervisor.py``); its methods run on the I/O
thread. An untrusted worker is a fresh ``python -I`` (``_worker_untrusted``)
that forks a process per job and relays that process's JSON answer, marked as
the job's, then reports the process's exit: the job is settled at the exit,
with the answer it gave or as a crash. Every message is read by a
non-blocking ``FrameReader`` (a worker that wrote half a message and stopped
stalls nothing) and checked by ``decode_untrusted``; anything out of place is
a protocol violation that fails only that worker's job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from procq._core import Core, Entry, LaneState, WorkerSlot
from procq._messages import send_jobs
from procq._processes import (
    ExecProcess,
    describe_exit,
    import_path,
    process_rss,
    worker_config,
)
from procq._protocol import (
    CUT_SHORT,
    ERROR,
    EXIT,
    FROM_JOB,
    FROM_WORKER,
    OK,
    READY,
    FrameReader,
    ProtocolError,
    decode_untrusted,
)
from procq._values import Completed, Failed, Failure

__all__ = ["MESSAGE_SLACK", "UntrustedWorkers"]

#: Room an untrusted worker's message may take beyond ``max_result_bytes``:
#: an error's traceback text, the JSON around a result.
MESSAGE_SLACK = 1 << 20


class UntrustedWorkers:
    core: Core
    context: Any
    _alive_r: int
    _by_object: dict[Any, WorkerSlot]
    _answers: dict[WorkerSlot, Completed[Any] | Failed]

    if TYPE_CHECKING:

        def _on_eof(self, worker: WorkerSlot) -> None: ...

        def _on_message(self, worker: WorkerSlot, message: tuple[Any, ...], wakeups: Any = None) -> list[Entry]: ...

        def _retire(self, worker: WorkerSlot) -> None: ...

        def _violation(self, worker: WorkerSlot, what: str) -> None: ...

    def _start_untrusted(self, lane: LaneState) -> WorkerSlot:
        """A fresh interpreter (``python -I``): it inherits no memory, no
        descriptor but its pipe and the liveness pipe, and only the
        environment the lane gives it."""
        spec = lane.spec
        parent_conn, child_conn = self.context.Pipe(duplex=True)
        env = dict(os.environ) if spec.inherit_env else {}
        env.update(spec.env or {})
        config = worker_config(spec)
        code = (
            "import sys, json; sys.path[:0] = json.loads(sys.argv[4]); "
            "from procq._worker_untrusted import exec_main; exec_main()"
        )
        argv = [
            sys.executable, "-I", "-c", code,
            json.dumps(config), str(child_conn.fileno()), str(self._alive_r), json.dumps(import_path()),
        ]
        try:
            popen = subprocess.Popen(
                argv,
                env=env,
                cwd=spec.cwd,
                stdin=subprocess.DEVNULL,
                close_fds=True,
                pass_fds=(child_conn.fileno(), self._alive_r),
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
        return WorkerSlot(lane, process, parent_conn, sentinel=process.sentinel, reader=reader)

    def _read_untrusted(self, worker: WorkerSlot) -> bool:
        assert worker.reader is not None
        try:
            frames = worker.reader.read()
        except EOFError:
            self._on_eof(worker)
            return False
        except ProtocolError as exc:
            self._violation(worker, str(exc))
            return False
        for frame in frames:
            self._on_untrusted(worker, frame)
            if worker.conn not in self._by_object:
                return False  # it broke the protocol
        return bool(frames)

    def _on_untrusted(self, worker: WorkerSlot, frame: bytes) -> None:
        """Act on one frame of an untrusted worker. Its last byte says who
        wrote it: the worker (READY, a job's exit) or the job's process (its
        answer; see ``_protocol``). A job is settled when the worker reports
        its process's exit, with the answer it gave, or as a crash if none."""
        body, origin = memoryview(frame)[:-1], frame[-1:]
        try:
            if origin == CUT_SHORT:
                raise ProtocolError("a message cut short (the job's process ended partway through writing it)")
            if origin not in (FROM_WORKER, FROM_JOB):
                raise ProtocolError(f"a message of unknown origin {origin!r}")
            message = decode_untrusted(bytes(body))
        except ProtocolError as exc:
            self._violation(worker, str(exc))
            return
        tag = message[1] if len(message) > 1 else READY
        if (origin == FROM_JOB) != (tag in (OK, ERROR)):
            what = {READY: "a READY message", EXIT: "an exit message", OK: "a result", ERROR: "an error message"}[tag]
            self._violation(worker, f"{what} written by {'the job' if origin == FROM_JOB else 'the worker itself'}")
            return
        if tag == READY:
            batch = self._on_message(worker, message)
            if batch:
                send_jobs(self.core, worker, batch)
            return
        job_id = message[0]
        held = worker.entry
        if held is None or held.job_id != job_id:
            what = "while it held no job" if held is None else f"while it held job {held.key!r}"
            self._violation(worker, f"a message about job id {job_id} {what}")
            return
        if tag == EXIT:
            self._job_exited(worker, held, message[2])
            return
        if worker in self._answers:
            self._violation(worker, f"a second answer for job {held.key!r}")
            return
        outcome: Completed[Any] | Failed
        if tag == OK:
            limit = worker.lane.spec.max_result
            if limit is not None and len(body) > limit:
                self._violation(worker, f"a result of {len(body)} bytes, more than the lane's max_result_bytes of {limit}")
                return
            outcome = Completed(message[2])
        else:
            kind, exc_type, text, tb = message[2:6]
            outcome = Failed(Failure(kind, text, exc_type, tb, pid=worker.pid))
        self._answers[worker] = outcome

    def _job_exited(self, worker: WorkerSlot, entry: Entry, returncode: int) -> None:
        """The process that ran ``entry`` exited: settle the job with its
        answer, or as a crash (a ``"timeout"`` for SIGXCPU) if it gave none.
        The worker takes the next job."""
        outcome = self._answers.pop(worker, None)
        crashed = outcome is None
        if outcome is None:
            sig, how, cause = describe_exit(returncode)
            explained = "" if not cause else f": {cause}" if sig else f" ({cause})"
            failure = Failure(
                "timeout" if sig == "SIGXCPU" else "crashed",
                f"the process running job {entry.key!r} (forked by worker {worker.pid} of lane "
                f"{worker.lane.name!r}) {how}{explained}",
                exitcode=returncode,
                signal=sig,
                pid=worker.pid,
            )
            outcome = Failed(failure)
        limit = worker.lane.spec.max_worker_rss_bytes
        retire = limit is not None and process_rss(worker.pid) > limit
        batch, status = self.core.job_done(worker, entry.job_id, outcome, retire, crashed=crashed)
        if status == "retire":
            self._retire(worker)
        elif batch:
            send_jobs(self.core, worker, batch)
