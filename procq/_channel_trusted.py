"""A trusted lane's worker channel: a ``multiprocessing`` child (``_worker``)
that runs each job itself and answers in pickles.

Its answers are read in bulk: every frame that has arrived is taken in one
read (a large one read whole at once), and each decodes straight to ``Ready``
or a ``Report``, so the supervisor settles them all in one ``Core.jobs_done``.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING

from procq._channel import Launch, ProcessChannel
from procq._errors import _RemoteTraceback
from procq._processes import pidfd, worker_config
from procq._protocol import OK, READY, SKIPPED, Event, FrameReader, Ready, Report
from procq._values import Completed, Failed, Failure, FailureKind
from procq._worker import worker_main

if TYPE_CHECKING:
    from procq._entries import Entry, LaneState, WorkerSlot

__all__ = ["TrustedChannel"]

#: A trusted worker's messages have no size limit but the format's.
TRUSTED_LIMIT = 1 << 62

_READY = Ready()


class TrustedChannel(ProcessChannel):
    @classmethod
    def start(cls, lane: LaneState, launch: Launch) -> TrustedChannel:
        parent_conn, child_conn = launch.context.Pipe(duplex=True)
        try:
            process = launch.context.Process(
                target=worker_main,
                args=(child_conn, lane.name, worker_config(lane.spec)),
                name=f"procq-worker-{launch.name}-{lane.name}",
                daemon=False,
            )
            process.start()
        except BaseException:
            parent_conn.close()
            raise
        finally:
            child_conn.close()  # the child has its own copy now
        sentinel = pidfd(process.pid)
        if sentinel is None:  # pragma: no cover - no pidfds: multiprocessing's own sentinel
            sentinel = process.sentinel
        reader = FrameReader(parent_conn.fileno(), TRUSTED_LIMIT, wait_whole=True)
        return cls(process, parent_conn, sentinel, reader)

    def read(self, worker: WorkerSlot) -> list[Event]:
        frames = self._reader.read()
        events: list[Event] = []
        new = tuple.__new__  # Report(...) without its Python-level __new__: this is per job
        for frame in frames:
            try:
                message = pickle.loads(frame)
            except Exception as exc:
                events.append(self._unreadable(worker, exc, events))
                continue
            job_id, tag = message[0], message[1]
            if tag == OK:
                events.append(new(Report, (job_id, Completed(message[2]), False, False)))
            elif tag == READY:
                events.append(_READY)
            elif tag == SKIPPED:
                # q.cancel() gave the job its failure already (Core.jobs_done uses it);
                # this one only stands in should that ever not be so.
                failure = Failure("cancelled", f"job id {job_id} was skipped by its worker")
                events.append(Report(job_id, Failed(failure), False, False))
            else:
                events.append(self._error(job_id, *message[2:7]))
        return events

    def _error(
        self, job_id: int, exc_bytes: bytes | None, exc_type: str, text: str, tb: str, kind: FailureKind
    ) -> Report:
        """An ERROR message. Kind "protocol" here: the worker refused to send
        a result over max_result_bytes; it broke nothing and stays. Kind
        "memory": the job went over its memory limit, which leaves a worker
        that may be bloated or half broken (and maybe children): it is replaced."""
        exception = None
        if exc_bytes is not None:
            try:
                exception = pickle.loads(exc_bytes)
                exception.__cause__ = _RemoteTraceback(tb)
            except Exception as exc:
                text = f"{text} (the exception could not be unpickled in the supervisor: {exc!r})"
                exception = None
        failure = Failure(kind, text, exc_type, tb, pid=self.pid, exception=exception)
        return Report(job_id, Failed(failure), kind == "memory", False)

    def _unreadable(self, worker: WorkerSlot, exc: Exception, earlier: list[Event]) -> Report:
        """A message that did not unpickle. A result travels pickled once, in
        its message (no pickle inside a pickle: a large output is copied once
        on each side, as the pipe forces), so the message cannot say which job
        it was for: it is the next job the worker was running, since a worker
        reports its jobs in order and reports nothing else while it runs one."""
        failure = Failure(
            "error",
            f"the job's result could not be unpickled in the supervisor: {exc!r}",
            exc_type=type(exc).__qualname__,
            pid=self.pid,
        )
        ran = sum(1 for event in earlier if type(event) is Report)  # jobs reported before it in this read
        held: Entry | None = worker.entry
        if ran and held is not None:
            try:
                held = worker.queue[ran - 1]  # (one index: no iteration over a deque another thread may change)
            except IndexError:
                held = None
        job_id = -1 if held is None else held.job_id
        return Report(job_id, Failed(failure), False, False)
