"""The floors: what the operating system and pickle cost, with no engine.

``RawPipes`` ("raw pipe"), the floor of every workload but latency: one
persistent child per worker, each with its own ``multiprocessing.Pipe``;
the parent sends ``pickle.dumps((job_id, fn, args))`` with ``send_bytes`` and
the child answers ``pickle.dumps((job_id, ok, value))``. There is no key, no
state map, no thread, no lock and no event: results are read by whichever
caller waits, in the caller's own thread.

The only logic beyond that is what keeps the floor correct under the
benchmark's own workloads:

- at most ``WINDOW`` jobs in flight per child, so neither side ever blocks on
  a full pipe while the other waits for it (the parent reads results before
  sending more);
- a child that dies fails the job it was running (a child runs its jobs in the
  order sent, so that is the oldest unanswered one), and is replaced; the jobs
  sent after it go to the replacement.

``BarePipes`` ("bare pipe"), the latency floor: none of that. One child,
one pipe, the caller writes and reads in its own thread. The raw pipe's
poll, window and bookkeeping cost a sequential round trip more than the
bare round trip takes (see bench/RESULTS.md): as a latency floor, it would
hide much of what an engine adds.
"""

from __future__ import annotations

import collections
import itertools
import math
import pickle
import select
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

WINDOW = 256
_dumps, _loads = pickle.dumps, pickle.loads
PROTOCOL = pickle.HIGHEST_PROTOCOL


class WorkerDied(Exception):
    def __init__(self, exitcode: int | None) -> None:
        super().__init__(f"raw pipe child died with exit code {exitcode}")
        self.exitcode = exitcode


def child_main(conn: Connection) -> None:
    recv, send = conn.recv_bytes, conn.send_bytes
    while True:
        try:
            job_id, fn, args = _loads(recv())
        except EOFError:
            return
        try:
            send(_dumps((job_id, True, fn(*args)), PROTOCOL))
        except Exception as exc:  # the job's error goes back to its waiter
            send(_dumps((job_id, False, exc), PROTOCOL))


class _Child:
    __slots__ = ("conn", "process", "readable", "sent")

    def __init__(self, process: Any, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        # One poll object, registered once: ``Connection.poll`` builds a
        # selector per call, which costs more than the round trip it guards.
        self.readable = select.poll()
        self.readable.register(conn.fileno(), select.POLLIN)
        self.sent: collections.deque[tuple[int, Callable[..., Any], tuple[Any, ...]]] = collections.deque()


def _send(child: _Child, job: tuple[int, Callable[..., Any], tuple[Any, ...]]) -> None:
    try:  # noqa: SIM105 - try/except costs less than contextlib.suppress on this per-job path
        child.conn.send_bytes(_dumps(job, PROTOCOL))
    except OSError:
        pass  # the child died: reading its pipe finds EOF, and the job goes to its replacement


class FloorFuture:
    __slots__ = ("job_id", "pool", "slot")

    def __init__(self, pool: RawPipes, job_id: int, slot: int) -> None:
        self.pool = pool
        self.job_id = job_id
        self.slot = slot

    def done(self) -> bool:
        return self.job_id in self.pool.results

    def result(self, timeout: float | None = None) -> Any:
        return self.pool.result(self, timeout)


class RawPipes:
    def __init__(self, workers: int, context: Any) -> None:
        self.context = context
        self.children = [self._start() for _ in range(workers)]
        self.results: dict[int, tuple[bool, Any]] = {}
        self._ids = itertools.count()
        self._rr = itertools.cycle(range(workers))
        self._dead: set[int] = set()

    def _start(self) -> _Child:
        parent, child = self.context.Pipe(duplex=True)
        process = self.context.Process(target=child_main, args=(child,), daemon=True)
        process.start()
        child.close()
        return _Child(process, parent)

    def submit(self, fn: Callable[..., Any], *args: Any) -> FloorFuture:
        job_id = next(self._ids)
        slot = next(self._rr)
        if slot in self._dead:
            self._revive(slot)
        while len(self.children[slot].sent) >= WINDOW:
            self._pump(slot, None)
        child = self.children[slot]
        child.sent.append((job_id, fn, args))
        _send(child, (job_id, fn, args))
        return FloorFuture(self, job_id, slot)

    def result(self, future: FloorFuture, timeout: float | None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        results, job_id = self.results, future.job_id
        while job_id not in results:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"raw pipe job {job_id} not done after {timeout}s")
            self._pump(future.slot, remaining)
        ok, value = results.pop(job_id)
        if ok:
            return value
        raise value

    def _pump(self, slot: int, timeout: float | None) -> None:
        """Read one answer from child ``slot``, waiting up to ``timeout``. Each
        waiter reads only its own child's pipe: no selector, no other thread."""
        if slot in self._dead:
            self._revive(slot)
        child = self.children[slot]
        try:
            if timeout is not None and not child.readable.poll(math.ceil(max(0.0, timeout) * 1000)):
                return
            job_id, ok, value = _loads(child.conn.recv_bytes())
        except (EOFError, OSError):
            self._died(slot)
            return
        child.sent.popleft()
        self.results[job_id] = (ok, value)

    def _died(self, slot: int) -> None:
        """Fail the dead child's job now; start its replacement once this
        waiter has its answer (the next time the slot is used)."""
        child = self.children[slot]
        child.process.join()
        child.conn.close()
        dead_job = child.sent.popleft()
        self.results[dead_job[0]] = (False, WorkerDied(child.process.exitcode))
        self._dead.add(slot)

    def _revive(self, slot: int) -> None:
        self._dead.discard(slot)
        dead = self.children[slot]
        fresh = self.children[slot] = self._start()
        for job_id, fn, args in dead.sent:  # sent to the dead child but never started: go again
            fresh.sent.append((job_id, fn, args))
            _send(fresh, (job_id, fn, args))

    def close(self) -> None:
        for slot in list(self._dead):
            self._revive(slot)
        for c in self.children:
            c.conn.close()
        for c in self.children:
            c.process.join(5)
            if c.process.exitcode is None:
                c.process.kill()
                c.process.join()


class BarePipes:
    """The least code that makes a round trip to a child: the latency floor.

    One child per worker, each on its own ``Pipe``; ``submit`` writes the
    pickled call to the next child's pipe and returns that child, and
    ``result`` reads the child's answer in the caller's own thread, blocking:
    no poll or select, no thread, no window, no job id, no timeout. So it
    serves only what the latency workload and the warm-up ask: at most one
    job in flight per child, each answer taken before that child's next
    submit. A child that dies raises ``EOFError`` at the read."""

    def __init__(self, workers: int, context: Any) -> None:
        self.children: list[tuple[Any, Connection]] = []
        for _ in range(workers):
            parent, child = context.Pipe(duplex=True)
            process = context.Process(target=bare_child_main, args=(child,), daemon=True)
            process.start()
            child.close()
            self.children.append((process, parent))
        self._rr = itertools.cycle(self.children)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Connection:
        conn = next(self._rr)[1]
        conn.send_bytes(_dumps((fn, args), PROTOCOL))
        return conn

    @staticmethod
    def result(conn: Connection, timeout: float | None = None) -> Any:
        return _loads(conn.recv_bytes())

    def close(self) -> None:
        for _, conn in self.children:
            conn.close()
        for process, _ in self.children:
            process.join(5)
            if process.exitcode is None:
                process.kill()
                process.join()


def bare_child_main(conn: Connection) -> None:
    recv, send = conn.recv_bytes, conn.send_bytes
    while True:
        try:
            fn, args = _loads(recv())
        except EOFError:
            return
        send(_dumps(fn(*args), PROTOCOL))
