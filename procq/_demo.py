"""``python -m procq demo``: a small real pipeline that shows what procq does.

Two lanes of two workers. The ``cpu`` lane counts primes and runs SHA-256
chains; the ``tools`` lane parses standard-library modules with ``ast`` and
scores their complexity. Some jobs go wrong on purpose: one reads a NULL
pointer (SIGSEGV), one SIGKILLs itself, one hangs until the demo SIGKILLs its
worker by pid, one parses a file with a syntax error, one runs past its
timeout. The steps::

    1. push "gate" jobs that hold every worker, then the rest: all Queued;
       push some keys again while they wait: InFlight
    2. open the gates; when the hanging job reports its pid, push its key again
       (InFlight) and SIGKILL that worker
    3. wait for every job
    4. push some completed keys again: Cached, nothing runs
    5. fix the broken file, retry the two failed tools keys: Queued, fresh runs
    then print one row per key and ``q.stats()``; exit 0 only if every job
    ended as expected (each failure with its expected kind and signal)

The gates make the InFlight pushes deterministic: a lane dispatches in push
order, so nothing behind a gate can start, let alone finish, before the demo
opens it. Jobs and demo talk through named pipes; nothing sleeps or polls.

Job functions live at module level so that workers can import them.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import ctypes
import hashlib
import os
import signal
import sys
import sysconfig
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NamedTuple

from procq import (
    Cached,
    Completed,
    Failed,
    Failure,
    InFlight,
    Job,
    JobFailed,
    JobHandle,
    Lane,
    ProcQueue,
    QueueStats,
    Queued,
)

__all__ = ["main"]

# --- Jobs: they run in the worker processes ---------------------------------------


class Result(NamedTuple):
    """What every demo job returns: its value, its worker's pid, seconds of work."""

    value: Any
    pid: int
    seconds: float


def count_primes(n: int) -> Result:
    """The number of primes below ``n``, by trial division (CPU-bound on purpose)."""
    start = time.perf_counter()
    count = 1 if n > 2 else 0
    for k in range(3, n, 2):
        d = 3
        while d * d <= k:
            if k % d == 0:
                break
            d += 2
        else:
            count += 1
    return Result(count, os.getpid(), time.perf_counter() - start)


def hash_chain(seed: str, rounds: int) -> Result:
    """SHA-256 applied ``rounds`` times to ``seed``: the last digest, in hex."""
    start = time.perf_counter()
    digest = seed.encode()
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return Result(digest.hex(), os.getpid(), time.perf_counter() - start)


def proof_of_work(seed: str, zeros: int) -> Result:
    """The first nonce whose SHA-256 starts with ``zeros`` hex zeros (64: never)."""
    start = time.perf_counter()
    target, nonce = "0" * zeros, 0
    while not hashlib.sha256(f"{seed}:{nonce}".encode()).hexdigest().startswith(target):
        nonce += 1
    return Result(nonce, os.getpid(), time.perf_counter() - start)


_BRANCHES = (
    ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler,
    ast.BoolOp, ast.comprehension, ast.Assert, ast.match_case,
)


def score_source(path: str) -> Result:
    """Parse a Python file: (functions, the most complex one, its cyclomatic complexity)."""
    start = time.perf_counter()
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=os.path.basename(path))
    functions, worst, worst_name = 0, 0, "-"
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions += 1
            complexity = 1 + sum(isinstance(n, _BRANCHES) for n in ast.walk(node))
            if complexity > worst:
                worst, worst_name = complexity, node.name
    return Result((functions, worst_name, worst), os.getpid(), time.perf_counter() - start)


def score_source_hung(path: str, report: str, hang: str) -> Result:
    """``score_source`` stuck before it starts, as on a read that never returns.
    It first writes its pid to the ``report`` pipe, so the demo can kill it."""
    fd = os.open(report, os.O_WRONLY)  # blocks until the demo listens
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)
    _wait_for_byte(hang)
    return score_source(path)


def read_null_pointer() -> Result:
    """Native code gone wrong: strlen() of a NULL pointer; the worker dies of SIGSEGV.
    (Not ``string_at(0, n)``: given a size, ctypes reads nothing at the address.)"""
    return Result(ctypes.string_at(0), os.getpid(), 0.0)


def kill_self() -> Result:
    """What the kernel's OOM killer does to a process: SIGKILL."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL cannot be caught")


def hold(gate: str, started: str) -> Result:
    """Say so on the ``started`` pipe, then occupy a worker until the demo
    writes to the ``gate`` pipe."""
    start = time.perf_counter()
    with open(started, "wb") as f:
        f.write(b".")
    _wait_for_byte(gate)
    return Result("released", os.getpid(), time.perf_counter() - start)


def _wait_for_byte(path: str) -> None:
    # Exactly one byte, unbuffered: a file object would read ahead and swallow
    # the bytes meant for the other jobs waiting on the same pipe.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.read(fd, 1)
    finally:
        os.close(fd)


# --- The plan ----------------------------------------------------------------------

LANES = {"cpu": Lane(workers=2), "tools": Lane(workers=2)}
HUNG, BROKEN = "ast:hung", "ast:broken"
_MODULES = (
    "textwrap shlex fnmatch glob heapq string colorsys base64 calendar difflib ipaddress "
    "fractions statistics csv tokenize ast dataclasses argparse configparser gettext pprint"
).split()
_BROKEN_SOURCE = "def total(prices):\n    return sum(prices) +\n"
_FIXED_SOURCE = "def total(prices):\n    return sum(prices)\n"


class DemoFailed(Exception):
    """Something the demo waits for did not happen; the message says what."""


@dataclass(frozen=True)
class Expect:
    """How a key's first run should end; ``kind`` None means Completed."""

    kind: str | None = None
    signal: str | None = None
    exc_type: str | None = None

    def matches(self, f: Failure) -> bool:
        return (f.kind, self.signal and f.signal, self.exc_type and f.exc_type) == (
            self.kind, self.signal, self.exc_type,
        )

    def __str__(self) -> str:
        detail = self.signal or self.exc_type
        if self.kind is None:
            return "Completed"
        return f"Failed ({self.kind}, {detail})" if detail else f"Failed ({self.kind})"


@dataclass
class Row:
    """One key: what is pushed and expected, and what was seen."""

    job: Job[Result]
    expect: Expect = Expect()
    join_early: bool = False  # pushed again while it waits: InFlight
    repush: bool = False  # pushed again once completed: Cached
    retry: Job[Result] | None = None  # pushed again once failed: Queued
    check: Callable[[Any], str | None] | None = None  # checks a completed value
    pushes: list[str] = field(default_factory=list)
    handle: JobHandle[Result] | None = None
    joined: list[JobHandle[Result]] = field(default_factory=list)
    pushed_at: float = 0.0
    ended_at: float | None = None
    first: Completed[Result] | Failed | None = None  # how the first run ended
    final: object = None  # q.state(key) at the end

    @property
    def key(self) -> str:
        return self.job.key

    @property
    def lane(self) -> str:
        return self.job.lane or ""


def plan(jobs: int, size: float, fifos: Fifos, broken: str) -> list[Row]:
    """Gates first, then per lane the jobs meant to fail, then ``jobs`` ordinary ones."""
    stdlib = sysconfig.get_paths()["stdlib"]
    sources = [p for p in (os.path.join(stdlib, m + ".py") for m in _MODULES) if os.path.exists(p)]
    if not sources:
        raise DemoFailed(f"no standard-library sources to parse under {stdlib}")
    rows = [Row(Job(f"gate:{lane}/{i}", hold, (fifos.go, fifos.started), lane=lane, timeout=300))
            for lane in LANES for i in (1, 2)]
    rows += [
        Row(Job("crash:segv", read_null_pointer, lane="cpu"), Expect("crashed", "SIGSEGV"), join_early=True),
        Row(Job("crash:sigkill", kill_self, lane="cpu"), Expect("crashed", "SIGKILL")),
        Row(Job("pow:unbounded", proof_of_work, ("procq", 64), lane="cpu", timeout=0.5), Expect("timeout")),
        Row(
            Job(HUNG, score_source_hung, (sources[0], fifos.report, fifos.hang), lane="tools", timeout=300),
            Expect("crashed", "SIGKILL"),
            retry=Job(HUNG, score_source, (sources[0],), lane="tools"),
        ),
        Row(
            Job(BROKEN, score_source, (broken,), lane="tools"),
            Expect("error", exc_type="SyntaxError"),
            retry=Job(BROKEN, score_source, (broken,), lane="tools"),
        ),
    ]
    for i in range(jobs):
        n = i // 2  # the job's place in its lane
        if i % 2 == 0 and n % 2 == 0:
            limit = int(size * (40_000 + 10_000 * (n // 2)))
            job, check = Job(f"primes:{limit}", count_primes, (limit,), lane="cpu"), _check_primes(limit)
        elif i % 2 == 0:
            seed, rounds = f"procq-{n // 2}", max(1, int(size * 150_000))
            job, check = Job(f"sha:{seed}", hash_chain, (seed, rounds), lane="cpu"), _check_hex
        else:
            cycle, which = divmod(n, len(sources))
            name = os.path.basename(sources[which])[:-3] + (f"#{cycle + 1}" if cycle else "")
            job, check = Job(f"ast:{name}", score_source, (sources[which],), lane="tools"), _check_score
        rows.append(Row(job, join_early=n % 3 == 0, repush=n % 4 == 1, check=check))
    return rows


def _check_primes(n: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        sieve = bytearray([1]) * max(n, 2)
        sieve[0:2] = b"\0\0"
        for p in range(2, int(n**0.5) + 1):
            if sieve[p]:
                sieve[p * p :: p] = bytes(len(range(p * p, n, p)))
        want = sum(sieve[:n])
        return None if value == want else f"counted {value} primes below {n}; a sieve says {want}"

    return check


def _check_hex(value: Any) -> str | None:
    ok = isinstance(value, str) and len(value) == 64 and set(value) <= set("0123456789abcdef")
    return None if ok else f"expected a SHA-256 hex digest, got {value!r}"


def _check_score(value: Any) -> str | None:
    ok = isinstance(value, tuple) and len(value) == 3 and value[0] >= 0 and value[2] >= min(1, value[0])
    return None if ok else f"expected (functions, name, complexity), got {value!r}"


class Fifos:
    """Named pipes: ``go`` opens the gates, ``report`` carries the hung job's
    pid, ``hang`` is what the hung job waits on (opened only at cleanup)."""

    def __init__(self, directory: str) -> None:
        names = ("go", "report", "hang", "started")
        self.go, self.report, self.hang, self.started = (os.path.join(directory, n) for n in names)
        for path in (self.go, self.report, self.hang, self.started):
            os.mkfifo(path)
        self._fds: dict[str, int] = {}

    def release(self, path: str, data: bytes = b"." * 64) -> None:
        """Let every job waiting on ``path`` go. The pipe stays open (until
        ``close``), so a job that opens it later does not block either."""
        if path not in self._fds:
            self._fds[path] = os.open(path, os.O_RDWR | os.O_NONBLOCK)
            os.write(self._fds[path], data)

    def wait_started(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` gate jobs have said they started (each writes one byte)."""
        import select

        # Read-write: we count as a writer too, so the pipe never reads as
        # EOF between two gates' writes (which would make select spin).
        fd = os.open(self.started, os.O_RDWR | os.O_NONBLOCK)
        try:
            seen, deadline = 0, time.monotonic() + timeout
            while seen < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                    return False
                try:
                    seen += len(os.read(fd, count - seen))
                except BlockingIOError:
                    continue
            return True
        finally:
            os.close(fd)

    def release_all(self) -> None:
        self.release(self.go)
        self.release(self.report, b"")
        self.release(self.hang)
        self.release(self.started, b"")  # a reader, so that no gate blocks opening it

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


# --- Running it ------------------------------------------------------------------------


class Demo:
    """Pushes the rows' jobs step by step, records what it sees, then checks and reports it."""

    def __init__(self, q: ProcQueue, rows: list[Row], fifos: Fifos, broken: str, timeout: float) -> None:
        self.q, self.rows, self.fifos, self.broken, self.timeout = q, rows, fifos, broken, timeout
        self.problems: list[str] = []
        self.released_at = 0.0
        self.hung_pid: int | None = None
        self.stats: QueueStats | None = None

    def push(self, row: Row, expect: type, job: Job[Result] | None = None) -> Any:
        outcome = self.q.push(job or row.job)
        row.pushes.append(type(outcome).__name__)
        if not isinstance(outcome, expect):
            got = type(outcome).__name__
            self.problems.append(f"{row.key}: a push gave {got}, expected {expect.__name__}")
        return outcome

    def run(self) -> None:
        q, rows = self.q, self.rows
        for row in rows:
            row.pushed_at = time.perf_counter()
            if isinstance(outcome := self.push(row, Queued), Queued):
                row.handle = outcome.handle
        say(f"1. pushed {len(rows)} keys: {tally(r.pushes[0] for r in rows)}; the gates hold all 4 workers")
        early = [row for row in rows if row.join_early]
        for row in early:
            if isinstance(outcome := self.push(row, InFlight), InFlight):
                row.joined.append(outcome.handle)
        say(f"   pushed {len(early)} of them again while they wait: {tally(r.pushes[-1] for r in early)}")
        gates = sum(row.key.startswith("gate:") for row in rows)
        if not self.fifos.wait_started(gates, self.timeout):
            raise DemoFailed(f"the {gates} gate jobs did not all start within {self.timeout}s")
        gated = q.stats()
        say("   stats: " + " | ".join(f"{n}: {s.running} running, {s.waiting} waiting"
                                      for n, s in gated.lanes.items()))
        for name, s in gated.lanes.items():
            behind = sum(r.lane == name for r in rows) - 2
            if (s.running, s.waiting) != (2, behind):
                self.problems.append(f"gated lane {name!r}: {s.running} running, {s.waiting} waiting; "
                                     f"expected 2 and {behind}")

        self.fifos.release(self.fifos.go)
        self.released_at = time.perf_counter()
        asyncio.run(self.wait_all())
        took = max(r.ended_at or 0.0 for r in rows) - self.released_at
        say(f"3. all {len(rows)} jobs ended {took:.2f}s after the gates opened: "
            f"{tally(type(r.first).__name__ for r in rows)}")

        again = [row for row in rows if row.repush and isinstance(row.first, Completed)]
        for row in again:
            outcome = self.push(row, Cached)
            if isinstance(outcome, Cached) and outcome != Cached(getattr(row.first, "output", None)):
                self.problems.append(f"{row.key}: Cached {outcome.output!r}, yet it returned {row.first!r}")
        say(f"4. pushed {len(again)} completed keys again: {tally(r.pushes[-1] for r in again)}"
            " (nothing ran)")

        with open(self.broken, "w", encoding="utf-8") as f:
            f.write(_FIXED_SOURCE)
        retried = [row for row in rows if row.retry is not None]
        for row in retried:
            if isinstance(outcome := self.push(row, Queued, row.retry), Queued):
                with contextlib.suppress(JobFailed):  # the final state says how it ended
                    outcome.handle.result(timeout=self.timeout)
        for row in rows:
            row.final = q.state(row.key)
        say(f"5. fixed the input, retried {len(retried)} failed keys: "
            f"{tally(r.pushes[-1] for r in retried)} -> {tally(type(r.final).__name__ for r in retried)}")
        self.stats = q.stats()

    async def wait_all(self) -> None:
        async def watch(row: Row, handle: JobHandle[Result]) -> None:
            try:
                row.first = Completed(await handle)
            except JobFailed as exc:
                row.first = Failed(exc.failure)
            row.ended_at = time.perf_counter()

        tasks = {row.key: asyncio.create_task(watch(row, row.handle)) for row in self.rows if row.handle}
        await self.kill_hung(tasks[HUNG])
        _, late = await asyncio.wait(tasks.values(), timeout=self.timeout)
        for task in late:
            task.cancel()
        if late:
            keys = ", ".join(sorted(k for k, t in tasks.items() if t in late))
            raise DemoFailed(f"{len(late)} jobs had not ended after {self.timeout:g}s: {keys}")

    async def kill_hung(self, hung: asyncio.Task[None]) -> None:
        """Wait for the hung job's pid; push its key again while it runs; SIGKILL its worker."""
        loop = asyncio.get_running_loop()
        heard: asyncio.Future[bytes] = loop.create_future()
        fd = os.open(self.fifos.report, os.O_RDONLY | os.O_NONBLOCK)
        try:
            def readable() -> None:
                if not heard.done():
                    heard.set_result(os.read(fd, 64))

            loop.add_reader(fd, readable)
            try:
                await asyncio.wait((heard, hung), timeout=self.timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                loop.remove_reader(fd)
        finally:
            os.close(fd)
        if not heard.done() or not heard.result().isdigit():
            raise DemoFailed(f"{HUNG!r} never reported its worker's pid")
        pid = self.hung_pid = int(heard.result())
        row = next(r for r in self.rows if r.key == HUNG)
        if isinstance(outcome := self.push(row, InFlight), InFlight):
            row.joined.append(outcome.handle)
        os.kill(pid, signal.SIGKILL)
        say(f"2. gates open; {HUNG!r} hangs in worker {pid}: pushed again ({row.pushes[-1]}), sent SIGKILL")

    # --- checking ---------------------------------------------------------------------

    def check(self) -> None:
        for row in self.rows:
            self.problems += [f"{row.key}: {text}" for text in self._check_row(row)]
        if self.stats is None:
            return
        s, rows = self.stats, self.rows
        keys = (s.pending, s.processing, s.completed, s.failed)
        ended = [type(r.final) for r in rows]
        want = (0, 0, ended.count(Completed), ended.count(Failed))
        if keys != want:
            self.problems.append(f"stats: keys {keys}, expected {want} (pending, processing, completed, failed)")
        for name, ls in s.lanes.items():
            # What this lane's jobs were seen to do; a retry is a second ending.
            mine = [r for r in rows if r.lane == name]
            kinds = [r.first.failure.kind for r in mine if isinstance(r.first, Failed)]
            ends = [type(r.first) for r in mine] + [type(r.final) for r in mine if r.retry is not None]
            expected = (
                0, 0, 2,
                kinds.count("crashed"),
                kinds.count("crashed") + kinds.count("timeout"),  # each worker death: one restart
                ends.count(Completed),
                ends.count(Failed),
            )
            have = (ls.waiting, ls.running, ls.workers_alive, ls.crashes, ls.worker_restarts,
                    ls.completed, ls.failed)
            if have != expected:
                self.problems.append(f"stats: lane {name!r} has {have}, expected {expected} (waiting, "
                                     "running, alive, crashes, restarts, completed, failed)")

    def _check_row(self, row: Row) -> Iterable[str]:
        first, expect = row.first, row.expect
        if first is None:
            yield "never ended"
            return
        if isinstance(first, Completed):
            if expect.kind is not None:
                yield f"expected {expect}, got Completed"
            elif row.check and (why := row.check(first.output.value)):
                yield why
            elif first.output.pid == os.getpid():
                yield "ran in the supervisor process"
        elif not expect.matches(first.failure):
            yield f"expected {expect}, got {short(first.failure)}"
        elif row.key == HUNG and first.failure.pid != self.hung_pid:
            yield f"failure.pid is {first.failure.pid}, but the demo killed {self.hung_pid}"
        for handle in row.joined:
            try:
                seen: object = Completed(handle.result(timeout=self.timeout))
            except JobFailed as exc:
                seen = Failed(exc.failure)
            if seen != first:
                yield f"a push that joined the job saw {seen!r}, not {first!r}"
        wanted = Completed if expect.kind is None or row.retry is not None else Failed
        if not isinstance(row.final, wanted):
            yield f"final state {type(row.final).__name__}, expected {wanted.__name__}"

    # --- reporting --------------------------------------------------------------------

    def table(self, verbose: bool) -> list[str]:
        head = ("key", "pushes", "state", "lane", "pid", "time", "result")
        body: list[tuple[str, ...]] = []
        notes: list[list[str]] = []
        for row in self.rows:
            pid, took, result, note = "-", "-", "", ""
            if isinstance(row.final, Completed):
                out: Result = row.final.output
                pid, took, result = str(out.pid), f"{out.seconds:.2f}s", show(row.key, out.value)
            elif isinstance(row.final, Failed):
                pid = str(row.final.failure.pid or "-")
                if row.ended_at is not None:
                    took = f"~{row.ended_at - max(row.pushed_at, self.released_at):.2f}s"
            if isinstance(row.first, Failed):
                f = row.first.failure
                if isinstance(row.final, Failed):
                    note = full(f) if verbose else short(f)
                else:  # retried: the row shows the fresh run, the note the failed one
                    note = f"1st run, pid {f.pid}: " + (full(f) if verbose else short(f, 62))
            state = type(row.final).__name__
            body.append((row.key, " ".join(row.pushes), state, row.lane, pid, took, result))
            notes.append(note.splitlines())
        widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]

        def line(cells: tuple[str, ...]) -> str:
            cols = enumerate(zip(cells, widths))
            return "  ".join(c.rjust(w) if i in (4, 5) else c.ljust(w) for i, (c, w) in cols)

        lines = [line(head).rstrip(), line(tuple("-" * w for w in widths))]
        for cells, note_lines in zip(body, notes):
            lines.append(line(cells).rstrip())
            lines += [("  `- " if i == 0 else "     ") + text for i, text in enumerate(note_lines)]
        lines += [
            "",
            "(time: seconds measured inside the job; ~ marks a failed job's wall time from its push",
            " or the gates' opening until its failure was seen: a crashed job cannot time itself)",
        ]
        return lines


def say(text: str) -> None:
    print(text, flush=True)


def tally(names: Iterable[str]) -> str:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{n} {name}" for name, n in counts.items()) or "none"


def short(f: Failure, limit: int = 80) -> str:
    """The kind and a short reason, naming the signal for a crash."""
    if f.kind == "crashed" and f.signal:
        return f"crashed: worker killed by {f.signal} (exit code {f.exitcode})"
    if f.kind == "crashed":
        return f"crashed: worker died with exit code {f.exitcode}"
    if f.kind == "timeout":
        return "timeout: ran past its time limit; its worker was SIGKILLed"
    text = str(f).splitlines()[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def full(f: Failure) -> str:
    return str(f) + (f"\n{f.traceback.rstrip()}" if f.traceback else "")


def show(key: str, value: Any) -> str:
    if key.startswith("primes:"):
        return f"{value} primes"
    if key.startswith("sha:"):
        return f"{value[:12]}..."
    if key.startswith("ast:"):
        return f"{value[0]} fns, max cc {value[2]}"
    return str(value)


def stats_lines(s: QueueStats) -> list[str]:
    cols = ("lane", "workers", "alive", "waiting", "running", "crashes", "restarts", "completed", "failed")
    rows = [cols] + [
        (n, ls.workers, ls.workers_alive, ls.waiting, ls.running, ls.crashes, ls.worker_restarts,
         ls.completed, ls.failed)
        for n, ls in s.lanes.items()
    ]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(cols))]
    lines = [f"keys: {s.pending} pending, {s.processing} processing, {s.completed} completed, "
             f"{s.failed} failed"]
    for r in rows:
        cells = enumerate(zip(r, widths))
        lines.append("  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w) for i, (v, w) in cells))
    return lines


# --- Entry point ------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m procq demo",
        description="Run a small procq pipeline: CPU-bound jobs (prime counts, SHA-256 chains) and "
        "parsing jobs (ast complexity of stdlib modules) in two lanes of two workers, with keys "
        "pushed again while they run (InFlight) and once completed (Cached), and jobs that "
        "raise, segfault, are SIGKILLed or time out, two of them then retried (Queued). "
        "Prints one row per key and the queue's stats.",
        epilog="Exit status: 0 if every job ended as expected (the expected failures included); "
        "1 if anything did not, with the reasons printed last; 2 for bad options.",
    )
    p.add_argument("--jobs", type=_at_least_4, default=24, metavar="N",
                   help="ordinary jobs besides the gates and the failing ones, split between the lanes "
                        "(default: 24, at least 4)")
    p.add_argument("--size", type=_positive, default=1.0, metavar="X",
                   help="scale the CPU jobs' work by X (default: 1.0)")
    p.add_argument("--start-method", choices=("forkserver", "spawn"),
                   help="how workers are started (default: procq's, forkserver on Linux)")
    p.add_argument("--timeout", type=_positive, default=60.0, metavar="SECONDS",
                   help="give up waiting for the jobs after this long (default: 60)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print failures in full, with the child's traceback")
    return p


def _at_least_4(text: str) -> int:
    if int(text) < 4:
        raise argparse.ArgumentTypeError(f"must be at least 4, got {text}")
    return int(text)


def _positive(text: str) -> float:
    if not 0 < float(text) < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return float(text)


def main(argv: list[str]) -> int:
    opts = _parser().parse_args(argv)
    start = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="procq-demo-"))
            fifos = Fifos(tmp)
            stack.callback(fifos.close)  # runs once the queue has closed
            broken = os.path.join(tmp, "broken_module.py")
            with open(broken, "w", encoding="utf-8") as f:
                f.write(_BROKEN_SOURCE)
            rows = plan(opts.jobs, opts.size, fifos, broken)
            q = stack.enter_context(ProcQueue(lanes=LANES, start_method=opts.start_method))
            lanes = ", ".join(f"{name} ({lane.workers} workers)" for name, lane in LANES.items())
            say(f"procq demo: {len(rows)} keys in lanes {lanes}; start method {q.start_method}")
            demo = Demo(q, rows, fifos, broken, opts.timeout)
            try:
                demo.run()
            finally:
                fifos.release_all()  # no job may still wait on a pipe when the queue closes
        demo.check()
    except KeyboardInterrupt:
        print("demo interrupted", file=sys.stderr)
        return 130
    except DemoFailed as exc:
        print(f"demo FAILED: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        traceback.print_exc()
        print(f"demo FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    say("\n" + "\n".join(demo.table(opts.verbose)))
    if demo.stats is not None:
        say("\nq.stats() at the end\n" + "\n".join("  " + line for line in stats_lines(demo.stats)))
    elapsed = time.perf_counter() - start
    if demo.problems:
        count = len(demo.problems)
        print(f"\ndemo FAILED after {elapsed:.1f}s: {count} unexpected outcome(s):", file=sys.stderr)
        print("\n".join(f"  - {text}" for text in demo.problems), file=sys.stderr)
        return 1
    say(f"\ndemo OK in {elapsed:.1f}s: every job ended as expected, the failures included")
    return 0
