"""``python -m bench.faults``: the same jobs under ProcessPoolExecutor, Pool and procq.

Twelve jobs, two workers each: nine healthy ones and three whose worker dies
(two SIGKILL themselves, one segfaults), spread through the list. Each engine
gets the same jobs through its own ordinary API, then one more healthy job to
see whether it is still usable. ``multiprocessing.Pool`` never answers a job
whose worker was killed, so every wait on it is bounded (``--wait`` seconds)
and a job that does not answer in time is counted as hung; the pool is then
terminated. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import dataclasses
import multiprocessing
import time
from collections.abc import Callable

from bench.fault_jobs import healthy, segfault, sigkill

START_METHOD = "forkserver"
WORKERS = 2
JOBS: list[Callable[[int], int]] = [
    healthy, healthy, sigkill, healthy, healthy, segfault,
    healthy, healthy, sigkill, healthy, healthy, healthy,
]  # fmt: skip
HEALTHY = sum(fn is healthy for fn in JOBS)
CRASHING = len(JOBS) - HEALTHY


@dataclasses.dataclass
class Row:
    engine: str
    answered: int = 0  # healthy jobs that returned their output
    reported: int = 0  # crashing jobs whose future failed (with whatever error)
    wrong: int = 0  # healthy jobs failed because another job crashed
    hung: int = 0  # jobs with no answer at all within the wait
    usable: bool = False  # a healthy job submitted afterwards is answered
    note: str = ""


def _tally(row: Row, fn: Callable[[int], int], n: int, get: Callable[[], object]) -> None:
    try:
        out = get()
    except (TimeoutError, multiprocessing.TimeoutError):
        row.hung += 1
    except Exception as e:  # every engine reports a crash its own way
        if fn is healthy:
            row.wrong += 1
            row.note = row.note or f"failures are {type(e).__name__}"
        else:
            row.reported += 1
    else:
        if fn is healthy and out == n * n:
            row.answered += 1


def run_ppe(wait: float) -> Row:
    row = Row("`concurrent.futures.ProcessPoolExecutor`")
    ctx = multiprocessing.get_context(START_METHOD)
    with cf.ProcessPoolExecutor(WORKERS, mp_context=ctx) as ex:
        futures = [ex.submit(fn, n) for n, fn in enumerate(JOBS)]
        for n, (fn, f) in enumerate(zip(JOBS, futures, strict=True)):
            _tally(row, fn, n, lambda f=f: f.result(timeout=wait))  # type: ignore[misc]
        try:
            row.usable = ex.submit(healthy, 7).result(timeout=wait) == 49
        except Exception as e:
            row.note = f"every failure and every later `submit` is {type(e).__name__}"
    return row


def run_pool(wait: float) -> Row:
    row = Row("`multiprocessing.Pool`")
    pool = multiprocessing.get_context(START_METHOD).Pool(WORKERS)
    try:
        results = [pool.apply_async(fn, (n,)) for n, fn in enumerate(JOBS)]
        deadline = time.monotonic() + wait
        for n, (fn, r) in enumerate(zip(JOBS, results, strict=True)):
            _tally(row, fn, n, lambda r=r: r.get(max(0.0, deadline - time.monotonic())))  # type: ignore[misc]
        with contextlib.suppress(multiprocessing.TimeoutError):
            row.usable = pool.apply_async(healthy, (7,)).get(wait) == 49
        if row.hung:
            row.note = f"no answer after {wait:g} s; pool terminated"
    finally:
        pool.terminate()
        pool.join()
    return row


def run_procq(wait: float) -> Row:
    import procq

    row = Row("`procq.Executor`")
    with procq.Executor(WORKERS, mp_context=START_METHOD) as ex:
        futures = [ex.submit(fn, n) for n, fn in enumerate(JOBS)]
        signals = set()
        for n, (fn, f) in enumerate(zip(JOBS, futures, strict=True)):
            _tally(row, fn, n, lambda f=f: f.result(timeout=wait))  # type: ignore[misc]
            if isinstance(f.exception(timeout=0) if f.done() else None, procq.JobFailed):
                signals.add(f.exception().failure.signal)  # type: ignore[union-attr]
        row.usable = ex.submit(healthy, 7).result(timeout=wait) == 49
        row.note = "each crash is a `JobFailed` naming its signal (" + ", ".join(sorted(s for s in signals if s)) + ")"
    return row


ENGINES = {"ppe": run_ppe, "pool": run_pool, "procq": run_procq}


def table(rows: list[Row]) -> str:
    lines = [
        f"| engine | healthy jobs answered (of {HEALTHY}) | crashed jobs failed (of {CRASHING}) "
        "| healthy jobs failed by another job's crash | jobs never answered | usable after | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        usable = "yes" if r.usable else "no"
        lines.append(f"| {r.engine} | {r.answered} | {r.reported} | {r.wrong} | {r.hung} | {usable} | {r.note} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=doc.strip().splitlines()[0])
    parser.add_argument("--wait", type=float, default=5.0, help="seconds to wait for a job before counting it hung")
    parser.add_argument("--engines", nargs="+", choices=list(ENGINES), default=list(ENGINES))
    args = parser.parse_args(argv)
    rows = [ENGINES[name](args.wait) for name in args.engines]
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
