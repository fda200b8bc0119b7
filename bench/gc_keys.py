"""What kept keys cost the garbage collector: a queue in memory holds N
completed keys (no-op jobs returning an int), and a full collection
(``gc.collect()``, the least of 5) is timed in the supervisor's process, with
the handles dropped and with the program keeping every handle. A full
collection stops every thread of the supervisor, its I/O thread included.
Beside it, the same process's collection before the queue was opened (the
interpreter's own objects and the bench's). Run alone:
``python -m bench.gc_keys [--quick]``.

Target (issue: cost stays flat as the work grows): a full ``gc.collect()``
with 300,000 kept keys takes under 30 ms.
"""

from __future__ import annotations

import gc
import os
import platform
import time
from typing import Any

from bench import standalone
from procq import Job, Lane, ProcQueue

#: Keys pushed per ``push_all``, each batch waited for before the next.
BATCH = 10_000


def noop(i: int) -> int:
    return i


def full_collection() -> float:
    """ms of the fastest of 5 full collections."""
    gc.collect()
    times = []
    for _ in range(5):
        began = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - began)
    return min(times) * 1e3


def with_keys(n: int, keep_handles: bool) -> tuple[float, int]:
    """(ms of a full collection, objects the collector tracks) with ``n`` completed keys kept."""
    kept: list[Any] = []
    with ProcQueue({"a": Lane(workers=2)}) as q:
        for start in range(0, n, BATCH):
            batch = [Job(f"k{i}", noop, args=(i,)) for i in range(start, min(n, start + BATCH))]
            handles = [outcome.handle for outcome in q.push_all(batch)]  # (every key new: each a Queued)
            for handle in handles:
                handle.result(timeout=120)
            if keep_handles:
                kept.extend(handles)
        del batch, handles
        assert q.stats().completed == n
        took = full_collection()
        tracked = len(gc.get_objects())
    return took, tracked


def run(quick: bool) -> list[str]:
    counts = (1_000, 10_000, 100_000) if quick else (1_000, 10_000, 100_000, 300_000, 1_000_000)
    bare = full_collection()
    lines = [
        f"# bench.gc_keys: Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs",
        "",
        f"A full collection with no queue open: {bare:.1f} ms.",
        "",
        "| kept keys | handles dropped: full collection, ms | objects tracked "
        "| handles kept: full collection, ms | objects tracked |",
        "|---:|---:|---:|---:|---:|",
    ]
    figures = {}
    for n in counts:
        dropped, dropped_tracked = with_keys(n, keep_handles=False)
        kept, kept_tracked = with_keys(n, keep_handles=True)
        figures[n] = dropped
        lines.append(f"| {n:,} | {dropped:.1f} | {dropped_tracked:,} | {kept:.1f} | {kept_tracked:,} |")
    if 300_000 in figures:
        took = figures[300_000]
        lines += [
            "",
            standalone.verdict(took < 30, f"a full gc.collect() with 300,000 kept keys under 30 ms: {took:.1f} ms"),
        ]
    return lines


def main(argv: list[str] | None = None) -> None:
    standalone.main("gc_keys", __doc__ or "", run, argv, "up to 100,000 keys")


if __name__ == "__main__":
    main()
