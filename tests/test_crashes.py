"""A job that crashes, raises, or cannot cross the process boundary fails alone.

The crash table (after loky's ``crash_cases``): each row is a way for a job to
end badly -- the worker exiting, killed by a signal, the job raising, or a
payload that cannot be pickled or unpickled on either side -- with the failure
kind, exit pattern and message it must produce. After every row the queue must
be fully usable: the lane back at its full concurrency, counters right, the
next jobs running.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jobs
import jobs_crashes
import psutil
import pytest
from core_support import awaited, open_queue
from process_support import children, linux_only, subreaper

from procq import (
    Failed,
    InFlight,
    Job,
    JobFailed,
    LaneStats,
    Processing,
    ProcQueue,
    Queued,
)
from procq._model.errors import _RemoteTraceback

CPU = "cpu"


@pytest.fixture
def q(start_method: str) -> Iterator[ProcQueue]:
    """A two-lane queue (cpu: 2 workers, io: 1) under each start method."""
    with open_queue({CPU: 2, "io": 1}, start_method=start_method) as queue:
        yield queue


# --- The table ---------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One way for a job to end badly, and exactly how the queue must report it.

    ``message`` is a regular expression the whole ``Failure.message`` must match;
    ``<pid>`` stands for the worker's pid and ``<key>`` for the job's key.
    """

    id: str
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kind: str = "error"  # "crashed", "error", or "push": TypeError at push
    message: str = ""
    exitcode: int | None = None
    signal: str | None = None
    exc_type: str | None = None
    # The exception JobFailed is chained from (the job's own, unpickled), if any.
    cause: type[BaseException] | None = None
    # Text the child's traceback must hold; None: no traceback at all.
    traceback: str | None = None
    # Whether the function body runs: it then reports its worker's pid first.
    runs: bool = True

    def pattern(self, pid: int, key: str) -> str:
        return self.message.replace("<pid>", str(pid)).replace("<key>", re.escape(key))


_DIED = r"^worker process <pid> \(lane 'cpu'\) "
_WHILE = r", while running job '<key>'$"
_IN_WORKER = r" \(the job's function or arguments could not be unpickled in the worker\)$"

CASES = [
    Case(
        "os-exit",
        jobs.exit_now,
        (3,),
        kind="crashed",
        exitcode=3,
        message=_DIED + r"exited with code 3 \(os\._exit\(\), or exit\(\) in native code, ended it mid-job\)" + _WHILE,
    ),
    Case(
        "sigkill",
        jobs.sigkill_self,
        kind="crashed",
        exitcode=-9,
        signal="SIGKILL",
        message=_DIED + r"was killed by SIGKILL \(signal 9\): killed with SIGKILL: by the kernel's OOM killer "
        r"if memory ran out, or by another process" + _WHILE,
    ),
    Case(
        "sigsegv",
        jobs.segfault,
        kind="crashed",
        exitcode=-11,
        signal="SIGSEGV",
        message=_DIED + r"was killed by SIGSEGV \(signal 11\): a segmentation fault: native code run by the job "
        r"crashed" + _WHILE,
    ),
    Case(
        "abort",
        jobs.abort,
        kind="crashed",
        exitcode=-6,
        signal="SIGABRT",
        message=_DIED + r"was killed by SIGABRT \(signal 6\): abort\(\) was called: os\.abort\(\), a failed C "
        r"assertion, or a fatal runtime error" + _WHILE,
    ),
    Case(
        "raise-valueerror",
        jobs.boom,
        ("boom",),
        exc_type="ValueError",
        message=r"^ValueError: boom$",
        cause=ValueError,
        traceback="ValueError: boom",
    ),
    Case(
        "raise-systemexit",
        jobs_crashes.raise_system_exit,
        (7,),
        exc_type="SystemExit",
        message=r"^SystemExit: 7$",
        cause=SystemExit,
        traceback="SystemExit: 7",
    ),
    Case(
        "raise-keyboardinterrupt",
        jobs_crashes.raise_keyboard_interrupt,
        exc_type="KeyboardInterrupt",
        message=r"^KeyboardInterrupt$",
        cause=KeyboardInterrupt,
        traceback="KeyboardInterrupt",
    ),
    Case(
        "exception-wont-pickle",
        jobs_crashes.raise_locked,
        ("locked",),
        exc_type="LockedError",
        message=r"^LockedError: locked \(the exception could not be pickled to send to the supervisor: "
        r"TypeError\(\"cannot pickle '_thread\.lock' object\"\)\)$",
        traceback="LockedError: locked",
    ),
    Case(
        "exception-wont-unpickle-in-supervisor",
        jobs_crashes.raise_homesick,
        ("far from home",),
        exc_type="HomesickError",
        message=r"^HomesickError: far from home \(the exception could not be unpickled in the supervisor: "
        r"RuntimeError\('HomesickError refuses to be unpickled outside process <pid>'\)\)$",
        traceback="HomesickError: far from home",
    ),
    Case(
        "result-wont-pickle-lock",
        jobs_crashes.return_lock,
        exc_type="TypeError",
        message=r"^TypeError: cannot pickle '_thread\.lock' object \(the job's result, a lock, could not be "
        r"pickled\)$",
        traceback="TypeError: cannot pickle '_thread.lock' object",
        cause=TypeError,
    ),
    Case(
        "result-wont-pickle-generator",
        jobs_crashes.return_generator,
        exc_type="TypeError",
        message=r"^TypeError: cannot pickle 'generator' object \(the job's result, a generator, could not be "
        r"pickled\)$",
        traceback="TypeError: cannot pickle 'generator' object",
        cause=TypeError,
    ),
    Case(
        "result-wont-unpickle-in-supervisor",
        jobs_crashes.return_unloadable,
        exc_type="RuntimeError",
        message=r"^the job's result could not be unpickled in the supervisor: "
        r"RuntimeError\('UnloadableValue refuses to be unpickled'\)$",
        traceback="RuntimeError: UnloadableValue refuses to be unpickled",  # (the supervisor's own)
    ),
    Case(
        "argument-wont-pickle",
        jobs.identity,
        (threading.Lock(),),
        kind="push",
        message=r"^job '<key>': its arguments could not be pickled: cannot pickle '_thread\.lock' object$",
    ),
    Case(
        "argument-wont-unpickle-in-worker",
        jobs.identity,
        (jobs_crashes.UnloadableValue(),),
        exc_type="RuntimeError",
        message=r"^RuntimeError: UnloadableValue refuses to be unpickled" + _IN_WORKER,
        traceback="RuntimeError: UnloadableValue refuses to be unpickled",
        runs=False,
    ),
    Case(
        "function-wont-pickle",
        jobs_crashes.LockedFn(),
        kind="push",
        message=r"^job '<key>': its function <jobs_crashes\.LockedFn object at 0x[0-9a-f]+> could not be "
        r"pickled: cannot pickle '_thread\.lock' object$",
    ),
    Case(
        "function-wont-unpickle-in-worker",
        jobs_crashes.UnloadableFn(),
        exc_type="RuntimeError",
        message=r"^RuntimeError: UnloadableFn refuses to be unpickled" + _IN_WORKER,
        traceback="RuntimeError: UnloadableFn refuses to be unpickled",
        runs=False,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_crash_table(q: ProcQueue, tmp_path: Any, case: Case) -> None:
    key = f"row:{case.id}"
    before = q.stats()
    if case.kind == "push":
        _assert_push_refused(q, key, case)
        _assert_lane_recovers(q, tmp_path, before.lanes[CPU], failed_pid=None, crashed=False, replaced=False)
        assert q.stats().lanes["io"] == before.lanes["io"]
        return

    worker_pids = set(q._worker_pids())
    if case.runs:
        started = jobs.fifo(tmp_path, "started")
        outcome = q.push(Job(key, jobs_crashes.report_pid_then, args=(started, case.fn, *case.args), lane=CPU))
        pid = int(jobs.wait_signal(started))
        assert pid in worker_pids
    else:
        outcome = q.push(Job(key, case.fn, case.args, lane=CPU))
        pid = None
    assert isinstance(outcome, Queued)

    with pytest.raises(JobFailed, match=rf"^job {re.escape(repr(key))} failed: {case.kind}: ") as info:
        outcome.handle.result(timeout=20)
    failure = info.value.failure
    if pid is None:
        assert failure.pid in worker_pids
        pid = failure.pid
    assert info.value.key == key
    assert failure.pid == pid
    assert (failure.kind, failure.exitcode, failure.signal, failure.exc_type) == (
        case.kind,
        case.exitcode,
        case.signal,
        case.exc_type,
    )
    assert re.search(case.pattern(pid, key), failure.message), failure.message
    if case.traceback is None:
        assert failure.traceback is None
    else:
        assert failure.traceback is not None and case.traceback in failure.traceback

    cause = info.value.__cause__
    if case.cause is None:
        # Without the exception itself, its traceback's text is the cause, where there is one.
        assert failure.exception is None
        if failure.traceback is None:
            assert cause is None
        else:
            assert type(cause) is _RemoteTraceback and str(cause) == failure.traceback
    else:
        assert type(cause) is case.cause and failure.exception is cause
        # The child's traceback is chained below the job's own exception.
        assert str(cause.__cause__) == failure.traceback

    assert q.state(key) == Failed(failure)
    assert outcome.handle.done() and outcome.handle.state == Failed(failure)
    crashed = case.kind == "crashed"
    after = q.stats()
    assert after.failed == before.failed + 1
    assert after.lanes[CPU].failed == before.lanes[CPU].failed + 1
    assert after.lanes[CPU].crashes == before.lanes[CPU].crashes + crashed
    _assert_lane_recovers(q, tmp_path, before.lanes[CPU], failed_pid=pid, crashed=crashed, replaced=crashed)
    # The other lane never noticed.
    assert q.stats().lanes["io"] == before.lanes["io"]


def _assert_push_refused(q: ProcQueue, key: str, case: Case) -> None:
    """An unpicklable function or argument raises TypeError at push; the key is
    left exactly as it was (absent, or Failed with the same failure)."""
    bad = Job(key, case.fn, case.args, lane=CPU)
    message = case.pattern(0, key)
    stats = q.stats()
    with pytest.raises(TypeError, match=message):
        q.push(bad)
    assert q.state(key) is None
    assert q.stats() == stats

    with pytest.raises(JobFailed, match="ValueError: first"):
        q.push_and_wait(Job(key, jobs.boom, args=("first",), lane=CPU), timeout=20)
    failed = q.state(key)
    assert isinstance(failed, Failed) and failed.failure.message == "ValueError: first"
    stats = q.stats()
    with pytest.raises(TypeError, match=message):
        q.push(bad)
    with pytest.raises(TypeError, match=message):
        q.push_and_wait(bad, timeout=20)
    assert q.state(key) == failed
    assert q.stats() == stats

    # Nothing is left claimed: the key takes good work at once.
    assert q.push_and_wait(Job(key, jobs.square, args=(4,), lane=CPU), timeout=20) == 16


def _assert_lane_recovers(
    q: ProcQueue, tmp_path: Any, before: LaneStats, *, failed_pid: int | None, crashed: bool, replaced: bool
) -> None:
    """The cpu lane runs two jobs at once again, on live workers, and counts right.

    Both jobs are held at FIFO gates, so seeing both report their pids proves
    two workers are alive and free at the same time: after a crash, that the
    replacement has joined the lane.
    """
    completed = q.stats().lanes[CPU].completed
    # One gate per job: a FIFO released once lets exactly one reader through
    # (the first buffered read takes every byte written).
    gates = [(jobs.fifo(tmp_path, f"after-started-{i}"), jobs.fifo(tmp_path, f"after-go-{i}")) for i in range(2)]
    handles = []
    pids = []
    for i, (started, go) in enumerate(gates):
        outcome = q.push(Job(f"after:{i}", jobs.signal_and_wait, args=(started, go), lane=CPU))
        assert isinstance(outcome, Queued)
        handles.append(outcome.handle)
        pids.append(int(jobs.wait_signal(started)))
    assert len(set(pids)) == 2
    assert set(pids) <= set(q._worker_pids())
    lane = q.stats().lanes[CPU]
    assert (lane.workers_alive, lane.running, lane.waiting) == (2, 2, 0)
    assert lane.crashes == before.crashes + crashed
    assert lane.worker_restarts == before.worker_restarts + replaced
    if failed_pid is not None:
        if replaced:
            assert failed_pid not in pids and failed_pid not in q._worker_pids()
            assert failed_pid not in children()  # reaped, not a zombie
        else:
            assert failed_pid in pids  # the worker that raised lives on
    fds = [jobs.release(go) for _, go in gates]
    try:
        assert [h.result(timeout=20) for h in handles] == pids
    finally:
        for fd in fds:
            os.close(fd)
    lane = q.stats().lanes[CPU]
    assert (lane.running, lane.completed) == (0, completed + 2)


# --- Around a crash -------------------------------------------------------------------


@pytest.mark.parametrize("action", [jobs.segfault, jobs.sigkill_self], ids=["sigsegv", "sigkill"])
def test_crash_fails_only_its_own_job(q: ProcQueue, tmp_path: Any, action: Callable[[], None]) -> None:
    """One worker crashes while the other holds a job and a third job waits:
    the held job completes on its own worker, the waiting one on the replacement."""
    held_started, held_go = jobs.fifo(tmp_path, "held-started"), jobs.fifo(tmp_path, "held-go")
    crash_started, crash_go = jobs.fifo(tmp_path, "crash-started"), jobs.fifo(tmp_path, "crash-go")
    held = q.push(Job("held", jobs.signal_and_wait, args=(held_started, held_go), lane=CPU)).handle
    held_pid = int(jobs.wait_signal(held_started))
    crash = q.push(
        Job("crash", jobs_crashes.report_pid_wait_then, args=(crash_started, crash_go, action), lane=CPU)
    ).handle
    crash_pid = int(jobs.wait_signal(crash_started))
    waiting = q.push(Job("waiting", jobs.getpid, lane=CPU)).handle
    assert crash_pid != held_pid
    assert q.stats().lanes[CPU].waiting == 1

    fds = [jobs.release(crash_go)]
    try:
        with pytest.raises(JobFailed, match=r"^job 'crash' failed: crashed: worker process \d+ "):
            crash.result(timeout=20)
        # The waiting job needs a worker: only the replacement is free.
        replacement_pid = waiting.result(timeout=20)
        assert replacement_pid not in (held_pid, crash_pid)
        assert q.state("held") == Processing() and not held.done()
        fds.append(jobs.release(held_go))
        assert held.result(timeout=20) == held_pid
    finally:
        for fd in fds:
            os.close(fd)
    failure = q.state("crash")
    assert isinstance(failure, Failed) and failure.failure.pid == crash_pid
    lane = q.stats().lanes[CPU]
    assert (lane.crashes, lane.worker_restarts, lane.completed, lane.failed) == (1, 1, 2, 1)
    assert (lane.workers_alive, lane.running, lane.waiting) == (2, 0, 0)
    assert {held_pid, replacement_pid} <= set(q._worker_pids()) and crash_pid not in q._worker_pids()


def test_every_waiter_gets_the_same_failure(q: ProcQueue, tmp_path: Any) -> None:
    """Handles that joined a crashing job -- blocked threads and an awaiting
    task -- are all woken, each with the same failure."""
    started, go = jobs.fifo(tmp_path, "started"), jobs.fifo(tmp_path, "go")
    job = Job("shared", jobs_crashes.report_pid_wait_then, args=(started, go, jobs.segfault), lane=CPU)
    first = q.push(job)
    assert isinstance(first, Queued)
    pid = int(jobs.wait_signal(started))
    joined = [q.push(job) for _ in range(3)]
    assert all(isinstance(o, InFlight) for o in joined)
    handles = [first.handle] + [o.handle for o in joined]

    errors: list[BaseException] = []
    lock = threading.Lock()

    def wait_in_thread(handle: Any) -> None:
        try:
            handle.result(timeout=20)
        except BaseException as exc:  # recorded and checked below
            with lock:
                errors.append(exc)

    async def wait_in_task(handle: Any) -> None:
        try:
            await asyncio.wait_for(awaited(handle), 20)
        except BaseException as exc:  # recorded and checked below
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=wait_in_thread, args=(h,)) for h in handles[:3]]
    threads.append(threading.Thread(target=asyncio.run, args=(wait_in_task(handles[3]),)))
    for t in threads:
        t.start()
    fd = jobs.release(go)
    try:
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
    finally:
        os.close(fd)

    assert len(errors) == 4 and all(type(e) is JobFailed for e in errors)
    failures = [e.failure for e in errors]  # type: ignore[attr-defined]
    assert all(f == failures[0] for f in failures)
    failure = failures[0]
    assert (failure.kind, failure.signal, failure.exitcode, failure.pid) == ("crashed", "SIGSEGV", -11, pid)
    assert re.fullmatch(
        rf"worker process {pid} \(lane 'cpu'\) was killed by SIGSEGV \(signal 11\): .*, while running job 'shared'",
        failure.message,
    )
    assert str(failure).startswith(f"crashed: worker process {pid} ")
    assert all(h.done() and h.state == Failed(failure) for h in handles)
    assert q.state("shared") == Failed(failure)
    lane = q.stats().lanes[CPU]
    assert (lane.crashes, lane.failed) == (1, 1)  # one job failed once, however many waited


# --- Time limits -------------------------------------------------------------------


def test_timeout_fails_the_job_and_the_lane_recovers(q: ProcQueue, tmp_path: Any) -> None:
    gate = jobs.fifo(tmp_path, "never")  # never released: only the time limit ends the job
    before = q.stats().lanes[CPU]
    worker_pids = set(q._worker_pids())
    handle = q.push(Job("slow", jobs.wait_released, args=(gate,), lane=CPU, timeout=0.3)).handle
    with pytest.raises(JobFailed, match=r"^job 'slow' failed: timeout: ") as info:
        handle.result(timeout=20)
    failure = info.value.failure
    assert failure.kind == "timeout" and failure.pid in worker_pids
    assert re.fullmatch(
        rf"job 'slow' ran longer than its timeout of 0\.3s; its worker \(pid {failure.pid}\) and that "
        r"process's tree were killed",
        failure.message,
    ), failure.message
    assert q.state("slow") == Failed(failure)
    lane = q.stats().lanes[CPU]
    assert lane.failed == before.failed + 1
    # A time limit is not a crash; the killed worker is still replaced.
    _assert_lane_recovers(q, tmp_path, before, failed_pid=failure.pid, crashed=False, replaced=True)


@pytest.mark.skipif(not linux_only, reason="needs PR_SET_CHILD_SUBREAPER to reap the killed grandchild")
def test_timeout_kills_the_jobs_whole_process_tree(q: ProcQueue, tmp_path: Any) -> None:
    """The job starts a child of its own; past the limit both are ended.

    The job writes its pids only after its child exists, and the time limit may
    run out before that on a loaded machine; then the attempt is repeated with a
    longer limit (the assertion itself never depends on how long anything took).
    """
    gate = jobs.fifo(tmp_path, "never")
    with subreaper():  # the orphaned grandchild becomes ours, so we can reap it
        for attempt, limit in enumerate((1.0, 4.0, 16.0)):
            report = str(tmp_path / f"pids-{attempt}")
            key = f"tree:{attempt}"
            handle = q.push(Job(key, jobs_crashes.hold_with_grandchild, args=(report, gate), timeout=limit)).handle
            with pytest.raises(JobFailed, match=rf"^job '{key}' failed: timeout: .* timeout of {limit:g}s"):
                handle.result(timeout=limit + 20)
            if os.path.exists(report):
                break
        else:
            pytest.fail("the job never got as far as starting its child")
        with open(report) as f:
            worker_pid, grandchild_pid = map(int, f.read().split())
        state = handle.state
        assert isinstance(state, Failed) and state.failure.pid == worker_pid
        grandchild = psutil.Process(grandchild_pid)
        gone, alive = psutil.wait_procs([grandchild], timeout=10)
        assert not alive, "the job's own child outlived the time limit"
        # Ended with its worker (SIGTERM, then SIGKILL after the grace), not any other way.
        assert [p.returncode for p in gone] in ([-signal.SIGTERM], [-signal.SIGKILL])  # type: ignore[attr-defined]
