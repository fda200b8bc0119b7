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

The jobs, the named pipes they wait on and the plan of keys are in
``procq._cli.demo_jobs``, which is where the workers import the jobs from.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable
from typing import Any

from procq import (
    Cached,
    Completed,
    Failed,
    Failure,
    InFlight,
    Job,
    JobFailed,
    JobHandle,
    ProcQueue,
    Queued,
    QueueStats,
)
from procq._cli.demo_jobs import HUNG, LANES, DemoFailed, Fifos, Result, Row, plan

__all__ = ["main"]

# What ast:broken parses: first with a syntax error, then fixed for its retry.
_BROKEN_SOURCE = "def total(prices):\n    return sum(prices) +\n"
_FIXED_SOURCE = "def total(prices):\n    return sum(prices)\n"


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
        say("   stats: " + " | ".join(f"{n}: {s.running} running, {s.waiting} waiting" for n, s in gated.lanes.items()))
        for name, s in gated.lanes.items():
            behind = sum(r.lane == name for r in rows) - 2
            if (s.running, s.waiting) != (2, behind):
                self.problems.append(
                    f"gated lane {name!r}: {s.running} running, {s.waiting} waiting; expected 2 and {behind}"
                )

        self.fifos.release(self.fifos.go)
        self.released_at = time.perf_counter()
        asyncio.run(self.wait_all())
        took = max(r.ended_at or 0.0 for r in rows) - self.released_at
        say(
            f"3. all {len(rows)} jobs ended {took:.2f}s after the gates opened: "
            f"{tally(type(r.first).__name__ for r in rows)}"
        )

        again = [row for row in rows if row.repush and isinstance(row.first, Completed)]
        for row in again:
            outcome = self.push(row, Cached)
            if isinstance(outcome, Cached) and outcome != Cached(getattr(row.first, "output", None)):
                self.problems.append(f"{row.key}: Cached {outcome.output!r}, yet it returned {row.first!r}")
        say(f"4. pushed {len(again)} completed keys again: {tally(r.pushes[-1] for r in again)} (nothing ran)")

        with open(self.broken, "w", encoding="utf-8") as f:
            f.write(_FIXED_SOURCE)
        retried = [row for row in rows if row.retry is not None]
        for row in retried:
            if isinstance(outcome := self.push(row, Queued, row.retry), Queued):
                with contextlib.suppress(JobFailed):  # the final state says how it ended
                    outcome.handle.result(timeout=self.timeout)
        for row in rows:
            row.final = q.state(row.key)
        say(
            f"5. fixed the input, retried {len(retried)} failed keys: "
            f"{tally(r.pushes[-1] for r in retried)} -> {tally(type(r.final).__name__ for r in retried)}"
        )
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
                0,
                0,
                2,
                kinds.count("crashed"),
                kinds.count("crashed") + kinds.count("timeout"),  # each worker death: one restart
                ends.count(Completed),
                ends.count(Failed),
            )
            have = (ls.waiting, ls.running, ls.workers_alive, ls.crashes, ls.worker_restarts, ls.completed, ls.failed)
            if have != expected:
                self.problems.append(
                    f"stats: lane {name!r} has {have}, expected {expected} (waiting, "
                    "running, alive, crashes, restarts, completed, failed)"
                )

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
            cols = enumerate(zip(cells, widths, strict=False))
            return "  ".join(c.rjust(w) if i in (4, 5) else c.ljust(w) for i, (c, w) in cols)

        lines = [line(head).rstrip(), line(tuple("-" * w for w in widths))]
        for cells, note_lines in zip(body, notes, strict=False):
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
        (
            n,
            ls.workers,
            ls.workers_alive,
            ls.waiting,
            ls.running,
            ls.crashes,
            ls.worker_restarts,
            ls.completed,
            ls.failed,
        )
        for n, ls in s.lanes.items()
    ]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(cols))]
    lines = [f"keys: {s.pending} pending, {s.processing} processing, {s.completed} completed, {s.failed} failed"]
    for r in rows:
        cells = enumerate(zip(r, widths, strict=False))
        lines.append("  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w) for i, (v, w) in cells))
    return lines


# --- Entry point ------------------------------------------------------------------------


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Run a small procq pipeline: CPU-bound jobs (prime counts, SHA-256 chains) and "
        "parsing jobs (ast complexity of stdlib modules) in two lanes of two workers, with keys "
        "pushed again while they run (InFlight) and once completed (Cached), and jobs that "
        "raise, segfault, are SIGKILLed or time out, two of them then retried (Queued). "
        "Prints one row per key and the queue's stats.",
        epilog="Exit status: 0 if every job ended as expected (the expected failures included); "
        "1 if anything did not, with the reasons printed last; 2 for bad options.",
    )
    p.add_argument(
        "--jobs",
        type=_at_least_4,
        default=24,
        metavar="N",
        help="ordinary jobs besides the gates and the failing ones, split between the lanes (default: 24, at least 4)",
    )
    p.add_argument(
        "--size", type=_positive, default=1.0, metavar="X", help="scale the CPU jobs' work by X (default: 1.0)"
    )
    p.add_argument(
        "--start-method",
        choices=("forkserver", "spawn"),
        help="how workers are started (default: procq's, forkserver on Linux)",
    )
    p.add_argument(
        "--timeout",
        type=_positive,
        default=60.0,
        metavar="SECONDS",
        help="give up waiting for the jobs after this long (default: 60)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="print failures in full, with the child's traceback")
    return p


def _at_least_4(text: str) -> int:
    if int(text) < 4:
        raise argparse.ArgumentTypeError(f"must be at least 4, got {text}")
    return int(text)


def _positive(text: str) -> float:
    if not 0 < float(text) < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return float(text)


def main(argv: list[str], prog: str = "procq demo") -> int:
    opts = _parser(prog).parse_args(argv)
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
