"""The supervisor's side of the worker protocol (``_protocol``): sending jobs
on a worker's pipe, and turning a trusted worker's messages into outcomes.

Sending is done by whichever thread holds the right to send on that worker's
pipe (``WorkerSlot.sending``, see ``_supervisor``): a pushing thread that
found the worker idle, or the I/O thread. The pipe is closed by the last
holder once the worker is dead or retired, never under a sender.
"""

from __future__ import annotations

import pickle
import threading
from dataclasses import replace
from typing import Any

from procq._core import Core
from procq._entries import Entry, WorkerLife, WorkerSlot
from procq._errors import _RemoteTraceback
from procq._processes import process_rss
from procq._protocol import CANCEL, ERROR, OK, READY, RUN, RUN_MANY, SKIPPED
from procq._values import Completed, Failed, Failure

__all__ = [
    "close_worker_pipe",
    "decode_trusted",
    "over_rss",
    "protocol_failure",
    "report",
    "send_job",
    "send_jobs",
    "send_skip",
]


#: A job frame larger than this is sent to an untrusted worker from a thread of
#: its own: a worker that stops reading its pipe can then stall nothing else.
UNTRUSTED_SEND_INLINE = 1 << 16


def send_job(core: Core, worker: WorkerSlot, entry: Entry) -> None:
    """Send ``entry`` to ``worker``; the caller holds the right to send (see above)."""
    try:
        fn_bytes: bytes | None = entry.fn_bytes
        if worker.fns.touch(entry.fn_id):
            fn_bytes = None
        if entry.memory_limit is not None:
            entry.rss_base = process_rss(worker.pid)
        frame = pickle.dumps((RUN, entry.job_id, entry.fn_id, fn_bytes, entry.args_bytes, entry.memory_limit), -1)
        if worker.reader is not None and len(frame) > UNTRUSTED_SEND_INLINE:
            thread = threading.Thread(target=_send_frame, args=(core, worker, frame), name="procq-send", daemon=True)
            thread.start()
            return  # that thread releases the pipe
    except BaseException:
        if core.sent(worker):
            close_worker_pipe(worker)
        raise
    _send_frame(core, worker, frame)


def send_skip(core: Core, worker: WorkerSlot, job_id: int) -> None:
    """Tell ``worker`` to skip job ``job_id``, which it holds unstarted
    (``q.cancel``, from the cancelling thread, so that the worker has it
    before ``cancel`` returns). Nothing is sent to a worker that is gone or
    going."""
    with core.lock:
        if worker.life is not WorkerLife.READY:  # gone or going
            return
        worker.sending += 1
    _send_frame(core, worker, pickle.dumps((CANCEL, job_id), -1))


def send_jobs(core: Core, worker: WorkerSlot, entries: list[Entry], rights: int = 1) -> None:
    """Send ``entries`` to ``worker`` in one frame; the caller holds ``rights``
    rights to send (see above), all given back after the one write."""
    if len(entries) == 1 and rights == 1:
        send_job(core, worker, entries[0])
        return
    try:
        fns = worker.fns
        runs = []
        for entry in entries:  # (none has a memory limit: see Dispatch._top_up)
            fn_bytes: bytes | None = None if fns.touch(entry.fn_id) else entry.fn_bytes
            runs.append((entry.job_id, entry.fn_id, fn_bytes, entry.args_bytes, entry.memory_limit))
        frame = pickle.dumps((RUN_MANY, runs), -1)
    except BaseException:
        if core.sent(worker, rights):
            close_worker_pipe(worker)
        raise
    _send_frame(core, worker, frame, rights)


def _send_frame(core: Core, worker: WorkerSlot, frame: bytes, rights: int = 1) -> None:
    try:
        with worker.write_lock:  # one frame at a time, whole (see WorkerSlot.write_lock)
            worker.conn.send_bytes(frame)
    except (OSError, ValueError):
        pass  # the worker died; its sentinel tells the I/O thread, which fails the job
    finally:
        if core.sent(worker, rights):
            close_worker_pipe(worker)


def _close(conn: Any) -> None:
    try:
        conn.close()
    except OSError:  # pragma: no cover
        pass


def report(worker: WorkerSlot, message: tuple[Any, ...]) -> tuple[int, Completed[Any] | Failed, bool, bool]:
    """``(job_id, outcome, retire, crashed)`` from a trusted worker's decoded
    report of a job's end (``crashed`` is always False: a trusted job that
    crashes takes its worker with it, which ``worker_died`` reports)."""
    job_id, tag = message[0], message[1]
    outcome: Completed[Any] | Failed
    if tag == OK:
        outcome = message[2]  # Completed, or Failed: the result did not unpickle
        if type(outcome) is Failed:
            outcome = Failed(replace(outcome.failure, pid=worker.pid))
        return job_id, outcome, False, False
    if tag == SKIPPED:
        # q.cancel() gave the job its failure already (Core.jobs_done uses it);
        # this one only stands in should that ever not be so.
        return job_id, Failed(Failure("cancelled", f"job id {job_id} was skipped by its worker")), False, False
    # (kind "protocol" here: the worker refused to send a result over
    # max_result_bytes; it broke nothing and stays.)
    kind, exc_type, text, tb, exception = message[2:7]
    outcome = Failed(Failure(kind, text, exc_type, tb, pid=worker.pid, exception=exception))
    # A job that went over its memory limit leaves a worker that may be
    # bloated or half broken (and maybe children): it is replaced.
    return job_id, outcome, kind == "memory", False


def over_rss(worker: WorkerSlot) -> bool:
    """Is the worker's resident memory past its lane's ``max_worker_rss``?"""
    limit = worker.lane.spec.max_worker_rss_bytes
    return limit is not None and process_rss(worker.pid) > limit


def protocol_failure(worker: WorkerSlot, entry: Entry, what: str) -> Failure:
    return Failure(
        "protocol",
        f"the worker (pid {worker.pid}, lane {worker.lane.name!r}) running job {entry.key!r} broke procq's "
        f"protocol with {what}; the job failed and the worker was replaced",
        pid=worker.pid,
    )


def decode_trusted(frame: bytes | bytearray, worker: WorkerSlot) -> tuple[Any, ...]:
    """A trusted worker's message, unpickled: ``(READY,)``,
    ``(job_id, OK, Completed | Failed)``, ``(job_id, SKIPPED)`` or
    ``(job_id, ERROR, kind, exc_type, message, traceback, exception)``.

    A result travels pickled once, in its message (no pickle inside a pickle:
    a large output is copied once on each side, as the pipe forces). So a
    message that fails to unpickle cannot say which job it was for; it is the
    result of the job the worker is running, since a worker reports its jobs
    in order and reports nothing else while it runs one."""
    try:
        message = pickle.loads(frame)
    except Exception as exc:
        failure = Failure(
            "error",
            f"the job's result could not be unpickled in the supervisor: {exc!r}",
            exc_type=type(exc).__qualname__,
        )
        held = worker.entry
        return (-1 if held is None else held.job_id, OK, Failed(failure))
    job_id, tag = message[0], message[1]
    if tag == READY:
        return (READY,)
    if tag == OK:
        return (job_id, OK, Completed(message[2]))
    if tag == SKIPPED:
        return (job_id, SKIPPED)
    exc_bytes, exc_type, text, tb, kind = message[2:7]
    exception = None
    if exc_bytes is not None:
        try:
            exception = pickle.loads(exc_bytes)
            exception.__cause__ = _RemoteTraceback(tb)
        except Exception as exc:
            text = f"{text} (the exception could not be unpickled in the supervisor: {exc!r})"
            exception = None
    return (job_id, ERROR, kind, exc_type, text, tb, exception)


def close_worker_pipe(worker: WorkerSlot) -> None:
    _close(worker.conn)
    if worker.reader is not None:
        worker.reader.close()
    if worker.inbox is not None:
        worker.inbox.close()
