"""What a SQLite store's size costs a queue that keeps keys under
``Retention``: a store prefilled with N completed rows, a queue on it with
``Retention(max_completed=N)`` (so each sweep deletes what the new keys push
past N), 3,000 tiny jobs pushed and waited for one after another (sweeps run
every third of the lease meanwhile), then ``q.stats()`` five times. Figures:
the pushes' median, p99 and longest round trip, and the median
``q.stats()``. Run alone: ``python -m bench.store_rows [--quick]``.

Targets (issue: cost stays flat as the work grows): at 200,000 rows no
push takes 50 ms and ``q.stats()`` takes under 20 ms.
"""

from __future__ import annotations

import os
import platform
import sqlite3
import statistics
import tempfile
import time

from bench import standalone
from procq import Job, Lane, ProcQueue, Retention


def tiny(i: int) -> int:
    return i


def _prefilled(rows: int, directory: str) -> str:
    """A store holding ``rows`` completed keys (copies of one real row), ended a second apart."""
    path = os.path.join(directory, "store.db")
    url = f"sqlite:///{path}"
    with ProcQueue({"a": Lane(workers=1)}, store=url) as q:
        q.push_and_wait(Job("first", tiny, args=(0,)))
    with sqlite3.connect(path) as db:
        row = db.execute("SELECT * FROM procq_keys WHERE key = 'first'").fetchone()
        columns = [c[1] for c in db.execute("PRAGMA table_info(procq_keys)")]
        key, run, ended = columns.index("key"), columns.index("run"), columns.index("ended")
        now = time.time()

        def made(i: int) -> list[object]:
            copy = list(row)
            copy[key], copy[run], copy[ended] = f"old{i}", f"r{i}", now - rows + i
            return copy

        db.executemany(f"INSERT INTO procq_keys VALUES ({','.join('?' * len(columns))})", map(made, range(rows)))
    return url


def measure(rows: int, pushes: int) -> tuple[float, float, float, float]:
    """(push p50, p99, longest, stats median), in ms."""
    with tempfile.TemporaryDirectory() as directory:
        url = _prefilled(rows, directory)
        took: list[float] = []
        with ProcQueue({"a": Lane(workers=1)}, store=url, retention=Retention(max_completed=rows)) as q:
            q.stats()  # (the first opens what it reads)
            for i in range(pushes):
                began = time.perf_counter()
                q.push_and_wait(Job(f"new{i}", tiny, args=(i,)))
                took.append((time.perf_counter() - began) * 1e3)
            stats = []
            for _ in range(5):
                began = time.perf_counter()
                q.stats()
                stats.append((time.perf_counter() - began) * 1e3)
    took.sort()
    return took[len(took) // 2], took[int(len(took) * 0.99)], took[-1], statistics.median(stats)


def run(quick: bool) -> list[str]:
    sizes = (1_000, 200_000) if quick else (1_000, 10_000, 100_000, 200_000, 1_000_000)
    lines = [
        f"# bench.store_rows: Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs",
        "",
        "| rows kept | push p50, ms | push p99, ms | longest push, ms | q.stats(), ms |",
        "|---:|---:|---:|---:|---:|",
    ]
    found = {}
    for rows in sizes:
        p50, p99, longest, stats = measure(rows, 3_000)
        found[rows] = (longest, stats)
        lines.append(f"| {rows:,} | {p50:.2f} | {p99:.1f} | {longest:.1f} | {stats:.1f} |")
    longest, stats = found[200_000]
    lines += [
        "",
        standalone.verdict(longest < 50, f"at 200,000 rows no push takes 50 ms: the longest {longest:.1f} ms"),
        standalone.verdict(stats < 20, f"at 200,000 rows q.stats() under 20 ms: {stats:.1f} ms"),
    ]
    return lines


def main(argv: list[str] | None = None) -> None:
    standalone.main("store_rows", __doc__ or "", run, argv, "two sizes only")


if __name__ == "__main__":
    main()
