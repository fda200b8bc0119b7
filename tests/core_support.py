"""Test-side helpers shared by the test modules (job functions live in jobs*.py,
which workers import; this module they never do)."""

from __future__ import annotations

import asyncio
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import jobs
import pytest

import procq._wire.protocol
from procq import Failure, Job, JobFailed, JobHandle, Lane, ProcQueue, Queued

T = TypeVar("T")

#: Bound on every wait for a job in these tests (pytest-timeout is 60 s).
WAIT = 20.0


class Gate:
    """A pair of FIFOs holding one job: the job says 'started' (with its pid),
    then waits until the test opens 'go'."""

    def __init__(self, directory: Any, name: str) -> None:
        self.started = jobs.fifo(directory, f"{name}.started")
        self.go = jobs.fifo(directory, f"{name}.go")
        self._fd: int | None = None

    def wait_started(self, timeout: float = WAIT) -> int:
        """Wait for the job to start; returns the pid it reported."""
        return int(jobs.wait_signal(self.started, timeout))

    def open(self) -> None:
        """Let the job (and any later job waiting on this gate) go."""
        if self._fd is None:
            self._fd = jobs.release(self.go)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Gates:
    """Makes gates in one directory and closes them all at the end."""

    def __init__(self, directory: Any) -> None:
        self.directory = directory
        self._gates: list[Gate] = []

    def __call__(self, name: str) -> Gate:
        gate = Gate(self.directory, name)
        self._gates.append(gate)
        return gate

    def close(self) -> None:
        for gate in self._gates:
            gate.close()


@contextmanager
def open_queue(lanes: int | Mapping[str, int | Lane], **kwargs: Any) -> Iterator[ProcQueue]:
    """A queue for one test: invariants checked on success; always closed
    without waiting (so a failed test holding a gated job cannot hang), and
    no worker left."""
    q = ProcQueue(lanes, **kwargs)
    try:
        yield q
        q._check_invariants()
    finally:
        q.close(wait=False)
    assert q._worker_pids() == []


class OnPickle:
    """An argument that runs ``action`` (once) when a push pickles it, i.e. in
    the pushing thread, after the push has claimed its key and before it offers
    the job to its lane. In the child it arrives as the str ``value``."""

    def __init__(self, action: Callable[[], None], value: str = "hooked") -> None:
        self.action = action
        self.value = value
        self.fired = 0

    def __reduce__(self) -> tuple[Any, ...]:
        self.fired += 1
        if self.fired == 1:
            self.action()
        return (str, (self.value,))


def read_log(path: Any) -> list[str]:
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


async def awaited(handle: JobHandle[T]) -> T:
    """``await handle`` as a coroutine (for asyncio.wait_for / create_task)."""
    return await handle


async def within(aw: Any, timeout: float = WAIT) -> Any:
    return await asyncio.wait_for(aw, timeout)


def run_noting_waits(fn: Callable[[], T], waiting: threading.Event) -> T:
    """Call ``fn()`` in this thread, setting ``waiting`` once the thread enters
    a ``threading`` wait (``Event.wait`` / ``Condition.wait``).

    This is how a test knows, without sleeping or polling, that a blocking
    ``push`` has stopped to wait for room: a push that finds room never waits,
    so ``waiting`` stays clear. (A profiler only observes calls; it changes
    nothing in the engine.)
    """
    # A thread waiting on a job a worker runs may wait on that worker's pipe
    # instead (procq/_supervisor/lead.py): procq's FrameReader.wait.
    wait_files = {threading.__file__, procq._wire.protocol.__file__}

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name == "wait" and frame.f_code.co_filename in wait_files:
            waiting.set()

    sys.setprofile(profile)
    try:
        return fn()
    finally:
        sys.setprofile(None)


class BlockingCall:
    """Runs ``fn()`` on a thread of its own; ``waiting`` is set once that
    thread blocks in a ``threading`` wait (see ``run_noting_waits``)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.waiting = threading.Event()
        self._fn = fn
        self._result: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="blocking-call")
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = run_noting_waits(self._fn, self.waiting)
        except BaseException as exc:
            self._error = exc

    def wait_blocked(self, timeout: float = WAIT) -> None:
        assert self.waiting.wait(timeout), "the call never blocked"
        assert self._thread.is_alive(), "the call returned instead of blocking"

    def outcome(self, timeout: float = WAIT) -> Any:
        """What ``fn()`` returned; re-raises what it raised."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the call did not return"
        if self._error is not None:
            raise self._error
        return self._result


# --- For jobs that must end badly (timed out, cancelled, killed) -----------------------


def wait_started(handle: JobHandle[Any], started: str, timeout: float = WAIT) -> bytes:
    """What a job sends on the FIFO ``started``; fails at once, with the job's
    failure, if the job ends before it sends anything."""
    r, w = os.pipe()

    def watch() -> None:  # wakes the select below if the job ends first
        with suppress(BaseException):  # only the wake-up matters here
            handle.result(timeout=timeout)
        try:
            os.write(w, b"x")
        except OSError:
            pass
        finally:
            os.close(w)

    fifo = os.open(started, os.O_RDONLY | os.O_NONBLOCK)
    try:
        threading.Thread(target=watch, daemon=True).start()
        ready, _, _ = select.select([fifo, r], [], [], timeout)
        if fifo in ready:
            data = os.read(fifo, 4096)
            if data:
                return data
        if r in ready:
            raise AssertionError(f"job {handle.key!r} ended before it started: {handle.state}")
        raise TimeoutError(f"job {handle.key!r} did not start within {timeout}s")
    finally:
        os.close(fifo)
        os.close(r)


def hold(q: ProcQueue, gates: Gates, key: str, lane: str | None = None) -> tuple[JobHandle[Any], int, Gate]:
    """Push a job that reports its pid and waits at its own gate until
    ``gate.open()``. Returns (handle, worker pid, gate)."""
    gate = gates(key)
    outcome = q.push(Job(key, jobs.signal_and_wait, args=(gate.started, gate.go), lane=lane))
    assert isinstance(outcome, Queued), outcome
    return outcome.handle, int(wait_started(outcome.handle, gate.started)), gate


def failure_of(handle: JobHandle[Any], kind: str, timeout: float = WAIT) -> Failure:
    """The handle's job must fail with ``kind``; returns its Failure."""
    with pytest.raises(JobFailed, match=rf"^job {re.escape(repr(handle.key))} failed: {kind}: ") as info:
        handle.result(timeout=timeout)
    return info.value.failure


def assert_all_gone(pids: list[int]) -> None:
    """Every process in ``pids`` exits (within a bounded wait). Call it under
    process_support.subreaper(), so that orphans are ours to reap."""
    import psutil

    procs = []
    for pid in pids:
        with suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:  # by pid, only what the test's own jobs started
        with suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=10)
    assert not alive, f"processes outlived their job: {[p.pid for p in alive]}"


def wait_until(check: Callable[[], Any], timeout: float = WAIT, what: str = "the condition") -> None:
    """Poll ``check`` until it is true; fail the test after ``timeout`` seconds
    (for states nothing signals: a write the store refused, say)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout}s")
        time.sleep(0.005)


def procq_run(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    """``python -m procq run ARGS`` in the tests' directory (its modules importable), fed ``stdin``."""
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": str(here.parent)}
    return subprocess.run(
        [sys.executable, "-m", "procq", "run", *args], cwd=here, input=stdin,
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
