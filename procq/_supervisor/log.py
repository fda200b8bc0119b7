"""procq's log: what the supervisor decided about its workers and their jobs.

Loggers (stdlib ``logging``), silent until the application configures
logging: ``procq`` carries a ``NullHandler``, so nothing reaches stderr
through logging's last-resort handler either.

- ``procq.worker``: a worker started, died (signal or exit code, and the job
  it held), was restarted or retired; a lane backing off because its workers
  die while they start; a worker that broke procq's protocol.
- ``procq.job``: a running job killed for its time or memory limit, or
  cancelled.
- ``procq.store``: the durable key store (``_durable.core``).

Levels: WARNING for what a user must see (a crash, a kill for a limit, a
protocol violation, a lane that cannot start workers), DEBUG for the rest
(starts, restarts, retirements, a worker's expected exit, cancels).

What a line holds: the job's key (the caller's own identifier for the work,
and the one thing that says which job a line is about), the worker's pid, its
lane, a signal's name, an exit code, a failure's kind, limits and sizes. Never
a job's arguments, output or exception text: those are the user's data, and
a log is read by people and systems that should not see it.

Every function here is called by the supervisor's I/O thread where the
event is decided, and returns at once unless its logger is enabled for the
level: nothing is formatted for a log nobody reads.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from procq._core.entries import Entry, LaneState, WorkerSlot

__all__ = [
    "backoff",
    "cancelled",
    "died",
    "main_not_preloaded",
    "memory_kill",
    "restart",
    "retired",
    "start_failed",
    "started",
    "timeout_kill",
    "violation",
]

logging.getLogger("procq").addHandler(logging.NullHandler())
worker_log = logging.getLogger("procq.worker")
job_log = logging.getLogger("procq.job")

DEBUG, WARNING = logging.DEBUG, logging.WARNING


def started(worker: WorkerSlot) -> None:
    if worker_log.isEnabledFor(DEBUG):
        worker_log.debug("worker %s started (lane %r)", worker.pid, worker.lane.name)


def start_failed(lane: LaneState, retry_in: float) -> None:
    """Starting a process failed (out of processes or memory, most likely)."""
    if worker_log.isEnabledFor(WARNING):
        worker_log.warning(
            "lane %r could not start a worker; it runs short and tries again in %gs", lane.name, retry_in
        )


def restart(lane: LaneState, after: str) -> None:
    if worker_log.isEnabledFor(DEBUG):
        worker_log.debug("lane %r starts a worker to replace one that %s", lane.name, after)


def retired(worker: WorkerSlot) -> None:
    if worker_log.isEnabledFor(DEBUG):
        worker_log.debug("worker %s (lane %r) retired; a fresh one replaces it", worker.pid, worker.lane.name)


def died(
    worker: WorkerSlot, entry: Entry | None, how: str, sig: str | None, exitcode: int | None, quiet: bool,
    unstarted: Entry | None = None,
) -> None:  # fmt: skip
    """A worker's death, seen by the I/O thread. A job it held and nobody
    decided to kill crashed with it: WARNING. A worker killed for a decision
    already logged (a limit, a cancel, a violation), retired, stopping with
    the queue (``quiet``) or exiting cleanly: DEBUG. One that died idle on its
    own, or before it started the job it was given (``unstarted``, which
    goes to another worker: not its fault): WARNING."""
    crashed = entry is not None and entry.kill_reason is None
    level = WARNING if crashed or (entry is None and not quiet and exitcode != 0) else DEBUG
    if not worker_log.isEnabledFor(level):
        return
    name = worker.lane.name
    if unstarted is not None:
        then = "goes to another worker" if unstarted.outcome is None else "failed: too many of its workers died so"
        worker_log.log(
            level, "worker %s (lane %r) %s before it started job %r, which was not the cause and %s",
            worker.pid, name, how, unstarted.key, then, extra=_extra(unstarted.key, worker, sig, exitcode),
        )  # fmt: skip
    elif crashed:
        assert entry is not None
        worker_log.warning(
            "worker %s (lane %r) %s while running job %r; the job failed (crashed)",
            worker.pid, name, how, entry.key, extra=_extra(entry.key, worker, sig, exitcode),
        )  # fmt: skip
    elif entry is not None:
        reason = entry.kill_reason
        kind = reason.kind if reason is not None else "?"
        worker_log.debug("worker %s (lane %r) %s, killed for job %r (%s)", worker.pid, name, how, entry.key, kind)
    else:
        worker_log.log(level, "worker %s (lane %r) %s while it held no job", worker.pid, name, how)


def backoff(lane: LaneState, failures: int, delay: float, how: str, failing_jobs: bool) -> None:
    """A lane's workers die while they start: it waits before the next start."""
    if worker_log.isEnabledFor(WARNING):
        worker_log.warning(
            "lane %r: a worker died while starting (%s; %d in a row); next start in %gs%s",
            lane.name, how, failures, delay, "; its waiting jobs fail" if failing_jobs else "",
        )  # fmt: skip


def violation(worker: WorkerSlot, entry: Entry | None, what: str) -> None:
    """A worker broke procq's protocol; ``what`` is procq's own description
    of the message (never its content)."""
    if worker_log.isEnabledFor(WARNING):
        key = None if entry is None else entry.key
        worker_log.warning(
            "worker %s (lane %r) broke procq's protocol with %s; killed%s",
            worker.pid, worker.lane.name, what, "" if key is None else f", job {key!r} failed (protocol)",
        )  # fmt: skip


def timeout_kill(worker: WorkerSlot, entry: Entry | None) -> None:
    if job_log.isEnabledFor(WARNING) and entry is not None:
        job_log.warning(
            "job %r ran past its time limit; its worker %s (lane %r) is killed",
            entry.key, worker.pid, worker.lane.name, extra=_extra(entry.key, worker, None, None),
        )  # fmt: skip


def memory_kill(worker: WorkerSlot, entry: Entry, limit: int, used: int) -> None:
    if job_log.isEnabledFor(WARNING):
        job_log.warning(
            "job %r went over its memory limit (%d bytes; its tree held %d more than the idle worker); "
            "its worker %s (lane %r) is killed",
            entry.key, limit, used, worker.pid, worker.lane.name, extra=_extra(entry.key, worker, None, None),
        )  # fmt: skip


def cancelled(worker: WorkerSlot, entry: Entry) -> None:
    if job_log.isEnabledFor(DEBUG):
        job_log.debug("job %r was cancelled while running; its worker %s is killed", entry.key, worker.pid)


def _extra(key: str, worker: WorkerSlot, sig: str | None, exitcode: int | None) -> dict[str, object]:
    """Fields a structured handler can read from the record (``record.procq_key`` ...)."""
    return {
        "procq_key": key,
        "procq_pid": worker.pid,
        "procq_lane": worker.lane.name,
        "procq_signal": sig,
        "procq_exitcode": exitcode,
    }


_said_why: str | None = None


def main_not_preloaded(why: str) -> None:
    """Log, at DEBUG, why the forkserver does not import the main module
    (each reason once: every worker of the process says the same)."""
    global _said_why
    if why == _said_why:
        return
    _said_why = why
    worker_log.debug("the forkserver does not import the main module: %s", why)
