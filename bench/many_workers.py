"""Many workers on few cores: one lane of N trusted workers runs 20,000
no-op jobs pushed at once (``push_all``), N from 2 to 100, on this
machine's cores. Figure: jobs a second, and its ratio to 2 workers. Run
alone: ``python -m bench.many_workers [--quick]``.

Target (issue: cost stays flat as the work grows): 100 workers on 2 cores
run no-op jobs at 0.8x or more of 2 workers.
"""

from __future__ import annotations

import os
import platform
import time

from bench import standalone
from procq import Job, Lane, ProcQueue

JOBS = 20_000


def noop(i: int) -> int:
    return i


def rate(workers: int, jobs: int = JOBS) -> float:
    with ProcQueue({"a": Lane(workers=workers)}) as q:
        q.push_and_wait(Job("warm", noop, args=(0,)))
        began = time.perf_counter()
        pushed = q.push_all([Job(f"k{workers}-{i}", noop, args=(i,)) for i in range(jobs)])
        for outcome in pushed:
            outcome.handle.result(timeout=300)  # type: ignore[union-attr]
        return jobs / (time.perf_counter() - began)


def run(quick: bool) -> list[str]:
    counts = (2, 100) if quick else (2, 8, 16, 32, 64, 100)
    rates = {n: rate(n) for n in counts}
    lines = [
        f"# bench.many_workers: Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
        f"{JOBS:,} no-op jobs pushed at once",
        "",
        "| workers | jobs/s | / 2 workers |",
        "|---:|---:|---:|",
        *(f"| {n} | {r:,.0f} | {r / rates[2]:.2f} |" for n, r in rates.items()),
        "",
    ]
    ratio = rates[100] / rates[2]
    lines.append(standalone.verdict(ratio >= 0.8, f"100 workers at 0.8x or more of 2: {ratio:.2f}x"))
    return lines


def main(argv: list[str] | None = None) -> None:
    standalone.main("many_workers", __doc__ or "", run, argv, "2 and 100 workers only")


if __name__ == "__main__":
    main()
