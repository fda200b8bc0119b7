"""What ``python -m procq demo`` runs: its jobs, the pipes they wait on, the plan of keys.

The job functions run in the worker processes, so they live at module level
in a module of their own, which the workers import without the demo's driver.
Every one returns a ``Result``; some go wrong on purpose (a NULL pointer read,
a SIGKILL, a hang, a syntax error, a run past its timeout).

``plan`` lays out one ``Row`` per key: the job pushed, how its first run should
end, whether it is pushed again, and a check of its value once completed.
``Fifos`` is the demo's end of the named pipes the gate and hung jobs wait on.
``procq._cli.demo`` runs the plan, checks what it saw and reports it.
"""

from __future__ import annotations

import ast
import ctypes
import hashlib
import os
import signal
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from procq import Completed, Failed, Failure, Job, JobHandle, Lane

__all__ = ["HUNG", "LANES", "DemoFailed", "Fifos", "Result", "Row", "plan"]


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
    ast.If,
    ast.IfExp,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.ExceptHandler,
    ast.BoolOp,
    ast.comprehension,
    ast.Assert,
    ast.match_case,
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
_MODULES = [
    "textwrap",
    "shlex",
    "fnmatch",
    "glob",
    "heapq",
    "string",
    "colorsys",
    "base64",
    "calendar",
    "difflib",
    "ipaddress",
    "fractions",
    "statistics",
    "csv",
    "tokenize",
    "ast",
    "dataclasses",
    "argparse",
    "configparser",
    "gettext",
    "pprint",
]


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
            self.kind,
            self.signal,
            self.exc_type,
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
    rows = [
        Row(Job(f"gate:{lane}/{i}", hold, (fifos.go, fifos.started), lane=lane, timeout=300))
        for lane in LANES
        for i in (1, 2)
    ]
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


# --- The named pipes between the demo and its jobs ---------------------------------


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
