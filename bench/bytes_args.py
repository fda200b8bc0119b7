"""A large ``bytes`` argument: a job given 100 MB of ``bytes`` (random, so
nothing compresses or dedupes) that returns its length, one after another,
through procq (one trusted worker) and through the raw pipe floor
(``bench.floor.RawPipes``: the pickle of the job written to a
``multiprocessing`` pipe), alternating in the same run. Figure: GB/s of
argument moved, median of the rounds. Run alone: ``python -m bench.bytes_args
[--quick]``.

Target (issue: cost stays flat as the work grows): procq moves a 100 MB
``bytes`` argument at least as fast as the raw pipe.
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import statistics
import time

from bench import standalone
from bench.floor import RawPipes
from procq import Job, Lane, ProcQueue

SIZE = 100_000_000


def length(data: bytes) -> int:
    return len(data)


def run(quick: bool) -> list[str]:
    rounds = 3 if quick else 10
    data = os.urandom(SIZE)
    rates: dict[str, list[float]] = {"procq": [], "raw pipe": []}
    floor = RawPipes(1, multiprocessing.get_context("forkserver"))
    try:
        with ProcQueue({"a": Lane(workers=1)}) as q:
            q.push_and_wait(Job("warm", length, args=(b"x",)))
            floor.result(floor.submit(length, b"x"), 60)
            for i in range(rounds):
                began = time.perf_counter()
                assert q.push_and_wait(Job(f"bytes-{i}", length, args=(data,)), timeout=120) == SIZE
                rates["procq"].append(SIZE / 1e9 / (time.perf_counter() - began))
                began = time.perf_counter()
                assert floor.result(floor.submit(length, data), 120) == SIZE
                rates["raw pipe"].append(SIZE / 1e9 / (time.perf_counter() - began))
    finally:
        floor.close()
    procq, pipe = statistics.median(rates["procq"]), statistics.median(rates["raw pipe"])
    return [
        f"# bench.bytes_args: Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
        f"{rounds} rounds of a 100 MB bytes argument",
        "",
        "| engine | GB/s (median) | rounds |",
        "|---|---:|---|",
        *(f"| {name} | {statistics.median(r):.2f} | {' '.join(f'{x:.2f}' for x in r)} |" for name, r in rates.items()),
        "",
        standalone.verdict(
            procq >= pipe,
            f"a 100 MB bytes argument at least as fast as the raw pipe: "
            f"procq {procq:.2f} GB/s vs {pipe:.2f} (x{procq / pipe:.2f})",
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    standalone.main("bytes_args", __doc__ or "", run, argv, "three rounds")


if __name__ == "__main__":
    main()
