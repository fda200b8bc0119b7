"""A Dask lane's worker channel: one slot of a ``DaskLane``, which runs its
jobs one at a time as tasks on a Dask cluster.

To the supervisor a slot is a worker like any other: it says READY, takes
one job at a time, reports each job's end, and "dies" when it is killed or
closed. Its ``messages`` and ``sentinel`` are two pipes of its own that the
I/O thread's selector watches; nothing of it is a process of this machine.

How a job travels::

    send_job (any thread holding the right to send)
      -> a coroutine on the Dask client's event loop (``DaskConnection.call``):
         Client.submit(_dask_remote.run_job, ..., key=token, pure=False, retries=0)
         await the future (its result is fetched by the event loop, never blocking it)
      -> the outcome goes in the slot's inbox, one byte in its messages pipe
    read (I/O thread): inbox -> Report events, decoded as a trusted lane's are
      (``_supervisor.channel_trusted``: plain results here, the rest on the lane's decode thread)

Nothing the event loop runs is user code, and it never waits on the
supervisor: it appends to a deque and writes one byte to a non-blocking pipe.

Ending a job from outside (timeout and memory limits are enforced on the far
side, see ``_cluster.remote``): ``terminate``/``kill`` (``q.cancel``, closing
without waiting) dooms the slot, runs ``_cluster.remote.kill_job`` on every Dask
worker (the one running the job ends its process tree), waits a moment for
the task to end, then cancels its future. The slot "dies" once its task has
ended, so the lane's ``workers`` bound holds on the cluster too; the
supervisor then fails the job with the reason it decided and starts a new slot.

A Dask worker that dies with a job on it: the scheduler, which must not run
the task again (``allowed-failures`` 0, checked by ``DaskConnection``), fails
the task with ``KilledWorker``, and the job fails with kind "crashed", naming
that worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from procq._cluster.lane import DaskLane
from procq._cluster.remote import close_pool, kill_job, run_job
from procq._core.channel import Launch, WorkerChannel
from procq._model.job import format_size
from procq._model.values import Failed, Failure
from procq._supervisor.channel_trusted import PickledResult, describe_error, error_report, result_outcome
from procq._supervisor.channels import KINDS
from procq._supervisor.failures import exit_failure
from procq._wire.protocol import ERROR, OK, OK_OBJECTS, TRAILER, Event, Ready, Report, Violation

if TYPE_CHECKING:
    from procq._core.core import Core
    from procq._core.entries import Entry, LaneState, WorkerSlot

__all__ = ["DaskChannel", "DaskConnection"]

#: How long a kill may take to reach a Dask worker, and its task to end after it.
KILL_REACH = 2.0
#: How long closing a lane may wait for the Dask workers to end its worker processes.
CLOSE_TIMEOUT = 10.0

_READY = object()  # the first thing in a slot's inbox


def _remote_config(spec: DaskLane) -> dict[str, Any]:
    """What the far side needs of the lane (plain data, sent with every job)."""
    return {
        "max_result_bytes": spec.max_result,
        "rlimits": spec.rlimits,
        "env": spec.env,
        "inherit_env": spec.inherit_env,  # (the Dask worker's environment, not this one's)
        "environ": None,
        "cwd": spec.cwd,
        "untraceable": False,
        "max_jobs_per_worker": spec.max_jobs_per_worker,
        "max_worker_rss": spec.max_worker_rss_bytes,
    }


class DaskConnection:
    """One queue's lane on a Dask cluster: the client, its event loop, and the
    id of the lane's worker processes on the Dask workers (``pool_id``)."""

    def __init__(self, lane: LaneState, queue_name: str) -> None:
        import distributed

        spec = lane.spec
        assert isinstance(spec, DaskLane)
        self.lane = lane.name
        self.own = isinstance(spec.cluster, str)
        if self.own:
            make: Any = distributed.Client
            try:
                client = make(spec.cluster, timeout=spec.connect_timeout, set_as_default=False)
            except OSError as exc:
                raise OSError(
                    f"lane {lane.name!r} could not reach the Dask scheduler at {spec.cluster!r} "
                    f"within {spec.connect_timeout:g}s: {exc}"
                ) from exc
        else:
            client = spec.cluster
        self.client: Any = client
        try:
            self._check_scheduler(spec)
        except BaseException:
            self.close_client()
            raise
        self.loop: asyncio.AbstractEventLoop = self.client.loop.asyncio_loop
        self.pool_id = f"{queue_name}-{lane.name}-{uuid.uuid4().hex[:12]}"
        self.config = _remote_config(spec)
        self.grace = spec.kill_grace
        self.timeout = spec.timeout

    def _check_scheduler(self, spec: DaskLane) -> None:
        """Refuse a scheduler that would run a task again after its worker
        died: that would run a job twice behind procq's back."""
        allowed = self.client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.allowed_failures)
        if allowed != 0:
            raise ValueError(
                f"lane {self.lane!r}: the Dask scheduler at {spec.address} runs a task again after its "
                f"worker died (distributed.scheduler.allowed-failures is {allowed}), so a job whose worker "
                "died would run again behind procq's back; start the scheduler with allowed-failures 0 "
                "(DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES=0, or "
                "dask.config.set({'distributed.scheduler.allowed-failures': 0}) before making a LocalCluster)"
            )

    def call(self, make: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run a coroutine on the client's event loop, from any thread."""
        asyncio.run_coroutine_threadsafe(make(), self.loop)

    def close(self) -> None:
        """End the lane's idle worker processes on every Dask worker, then
        the client if procq made it (the queue closed: every slot has ended)."""
        with contextlib.suppress(Exception):
            self.client.run(close_pool, self.pool_id, on_error="ignore", callback_timeout=CLOSE_TIMEOUT)
        self.close_client()

    def close_client(self) -> None:
        if self.own:
            with contextlib.suppress(Exception):
                self.client.close(timeout=CLOSE_TIMEOUT)


class DaskChannel(WorkerChannel):
    """One slot of a Dask lane (see the module docstring)."""

    pid = None  # (no local process)

    @classmethod
    def start(cls, lane: LaneState, launch: Launch) -> DaskChannel:
        connection = launch.lanes.get(lane.name)
        if connection is None:  # the lane's first slot: connect (on the I/O thread, as the queue opens)
            connection = launch.lanes[lane.name] = DaskConnection(lane, launch.name)
        return cls(lane.name, connection)

    @classmethod
    def close_lane(cls, lane: LaneState, launch: Launch) -> None:
        connection = launch.lanes.pop(lane.name, None)
        if connection is not None:
            connection.close()

    def __init__(self, lane: str, connection: DaskConnection) -> None:
        self._lane = lane
        self._connection = connection
        self._msg_r, self._msg_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._end_r, self._end_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.messages = self._msg_r
        self.sentinel = self._end_r
        self._lock = threading.Lock()  # guards what follows, between the I/O thread, senders and the loop
        self._inbox: deque[Any] = deque([_READY])  # _READY, then (job_id, entry, finished) per job
        self._out = False  # a task of this slot is on the cluster
        self._doomed = False  # killed or closed: takes no job; "dies" once no task is out
        self._ended = False  # its sentinel fired
        self._released = False
        self._kill_grace: float | None = None  # the kill sent for the task out, if any
        self._exitcode: int | None = 0
        # Loop-side state of the task out (touched only on the event loop).
        self._future: Any = None
        self._done: asyncio.Future[None] | None = None
        self._token = ""
        self._poke(self._msg_w)

    def _poke(self, fd: int) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # (a byte already waits: that is enough)
            os.write(fd, b"x")

    # --- sending, from the thread holding the right to send ---------------------

    def send_job(self, core: Core, worker: WorkerSlot, entry: Entry) -> None:
        try:
            connection = self._connection
            job = (entry.job_id, entry.fn_id, entry.fn_bytes, entry.args_bytes, entry.memory_limit)
            timeout = entry.timeout if entry.timeout is not None else connection.timeout
            token = f"procq-{connection.pool_id}-{entry.job_id}"
            with self._lock:
                self._out = True
                self._token = token
            try:
                connection.call(lambda: self._run(token, entry, job, timeout))
            except Exception as exc:  # the client's loop is gone (the client was closed under us)
                self._finished(entry, ("dask", exc))
        finally:
            if core.sent(worker):
                self.close()

    def send_jobs(self, core: Core, worker: WorkerSlot, entries: list[Entry], rights: int = 1) -> None:
        # (A remote lane's jobs are never sent ahead: always one, with one right.)
        assert len(entries) == 1 and rights == 1, (len(entries), rights)
        self.send_job(core, worker, entries[0])

    def send_skip(self, core: Core, worker: WorkerSlot, job_id: int) -> None:  # pragma: no cover - never sent ahead
        if core.sent(worker):
            self.close()

    # --- on the client's event loop ------------------------------------------------

    async def _run(self, token: str, entry: Entry, job: tuple[Any, ...], timeout: float | None) -> None:
        connection = self._connection
        self._done = done = asyncio.get_running_loop().create_future()
        future = None
        try:
            future = connection.client.submit(
                run_job, connection.pool_id, connection.config, token, job, timeout, connection.grace,
                key=token, pure=False, retries=0,
            )  # fmt: skip
            self._future = future
            finished: tuple[Any, ...] = ("done", await future)
        except BaseException as exc:  # the task's failure as Dask reports it (KilledWorker, cancelled, ...)
            finished = ("dask", exc)
        finally:
            self._future = None
            done.set_result(None)
            if future is not None:
                with contextlib.suppress(Exception):
                    future.release()
        self._finished(entry, finished)

    def _finished(self, entry: Entry, finished: tuple[Any, ...]) -> None:
        """The task's end: to the inbox, or, for a slot killed meanwhile, its death."""
        with self._lock:
            self._out = False
            if self._released:
                return
            if not self._doomed:
                self._inbox.append((entry.job_id, entry, finished))
                self._poke(self._msg_w)
                return
            if finished[0] == "done" and finished[1][0] != "frame":
                self._exitcode = finished[1][1]
            self._end_locked()

    async def _kill_remote(self, token: str, grace: float) -> None:
        client = self._connection.client
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.run(kill_job, token, grace, on_error="ignore", asynchronous=True), KILL_REACH)
        done, future = self._done, self._future
        if done is None or done.done() or future is None or self._token != token:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(done), grace + KILL_REACH)
        if not done.done():  # still queued on the cluster, or its worker does not answer
            with contextlib.suppress(Exception):
                await client.cancel([future], asynchronous=True, reason="procq killed the job")

    # --- the I/O thread ----------------------------------------------------------

    def read(self, worker: WorkerSlot) -> list[Event]:
        with contextlib.suppress(BlockingIOError, OSError):
            os.read(self._msg_r, 4096)
        events: list[Event] = []
        inbox = self._inbox
        while inbox:
            item = inbox.popleft()
            if item is _READY:
                events.append(Ready())
            else:
                events.append(self._report(*item))
        return events

    def _report(self, job_id: int, entry: Entry, finished: tuple[Any, ...]) -> Event:
        """A task's end as the event a local worker's would be. A job whose
        process died, went over a limit or lost its Dask worker retires the
        slot (a fresh one replaces it), as a local worker is replaced then:
        the lane's ``worker_restarts`` count the same."""
        how, value = finished
        if how == "dask":
            return Report(job_id, Failed(self._dask_failure(entry, value)), True, True)
        tag, pid, address = value[0], value[2], value[3]
        where = f"on Dask worker {address}"
        if tag == "frame":
            frame = value[1]
            end = len(frame) - TRAILER.size
            if end < 0:
                return Violation(f"a message of {len(frame)} bytes, too short to say which job it is about")
            said, kind = TRAILER.unpack_from(frame, end)
            if said != job_id:
                return Violation(f"a report about job id {said} for job id {job_id}")
            if kind == OK:
                return Report(job_id, result_outcome(frame, end, pid), False, False)
            if kind == OK_OBJECTS:
                return Report(job_id, PickledResult(frame, pid), False, False)
            if kind == ERROR:
                return error_report(job_id, frame, end, pid)
            return Violation(f"a message with an unknown tag {kind}")
        if tag == "boot":
            failure = Failure("crashed", f"job {entry.key!r} could not start {where}: {value[1]}")
            return Report(job_id, Failed(failure), True, True)
        exitcode = value[1]
        sig = exit_failure(exitcode, "", pid).signal
        if tag == "timeout":
            limit, whose = entry.timeout, "its timeout"
            if limit is None:
                limit, whose = self._connection.timeout, f"the timeout of lane {self._lane!r}"
            text = (
                f"job {entry.key!r} ran longer than {whose} of {limit:g}s; its worker (pid {pid}, {where}) "
                "and that process's tree were killed"
            )
            return Report(job_id, Failed(Failure("timeout", text, exitcode=exitcode, signal=sig, pid=pid)), True, False)
        if tag == "memory":
            limit = entry.memory_limit or 0
            text = (
                f"job {entry.key!r} went over its memory_limit of {format_size(limit)} (its process tree "
                f"held {format_size(value[4])} more than the idle worker); its worker (pid {pid}, {where}) and "
                "that process's tree were killed"
            )
            return Report(job_id, Failed(Failure("memory", text, exitcode=exitcode, signal=sig, pid=pid)), True, False)
        if tag == "killed":  # a kill this slot did not send (a task of a closed lane): it ends cancelled
            failure = Failure("cancelled", f"job {entry.key!r} was cancelled {where}", exitcode=exitcode, pid=pid)
            return Report(job_id, Failed(failure), True, False)
        who = f"worker process {pid} {where} (lane {self._lane!r})"
        failure = exit_failure(exitcode, who, pid, f", while running job {entry.key!r}")
        return Report(job_id, Failed(failure), True, True)

    def _dask_failure(self, entry: Entry, exc: BaseException) -> Failure:
        from distributed import KilledWorker
        from distributed.client import FutureCancelledError

        name = type(exc).__qualname__
        if isinstance(exc, KilledWorker):
            address = getattr(exc.last_worker, "address", exc.last_worker)
            return Failure(
                "crashed",
                f"Dask worker {address} died (or the scheduler lost it) while it held job {entry.key!r} "
                "of lane {!r}; the job's process went with it. Its log says why".format(self._lane),
                exc_type=name,
            )
        if isinstance(exc, (FutureCancelledError, asyncio.CancelledError)):
            return Failure(
                "crashed",
                f"job {entry.key!r}'s Dask task was cancelled on the cluster, not by procq "
                f"(the scheduler restarted or lost this client?): {describe_error(exc)}",
                exc_type=name,
            )
        return Failure(
            "error",
            f"the Dask cluster could not run job {entry.key!r}: {describe_error(exc)} (is procq, with the "
            "modules of the job's function, installed on the Dask workers?)",
            exc_type=name,
        )

    def rss(self) -> int:
        return 0  # (max_worker_rss is applied on the far side, to each worker process)

    def job_memory(self, entry: Entry, children: dict[int, list[int]]) -> int:
        return 0  # (memory limits are enforced on the far side)

    def terminate(self) -> list[Any]:
        self._kill(self._connection.grace)
        return []

    def kill(self, descendants: list[Any] | None = None) -> None:
        self._kill(0.0)

    def _kill(self, grace: float) -> None:
        """Doom the slot; end its task's process tree on the cluster, if it has one out."""
        with self._lock:
            self._doomed = True
            if not self._out:
                self._end_locked()
                return
            if self._kill_grace is not None and self._kill_grace <= grace:
                return
            self._kill_grace = grace
            token = self._token
            self._exitcode = None
        self._connection.call(lambda: self._kill_remote(token, grace))

    def kill_group(self) -> None:
        pass  # (nothing of it runs here)

    def close(self) -> None:
        """No more jobs: the slot ends now, or when its task has ended."""
        with self._lock:
            self._doomed = True
            if not self._out:
                self._end_locked()

    def _end_locked(self) -> None:
        if not self._ended and not self._released:
            self._ended = True
            self._poke(self._end_w)

    def reap(self) -> int | None:
        return self._exitcode

    def release(self) -> None:
        with self._lock:
            self._released = True
            for fd in (self._msg_r, self._msg_w, self._end_r, self._end_w):
                with contextlib.suppress(OSError):
                    os.close(fd)


KINDS["remote"] = DaskChannel
