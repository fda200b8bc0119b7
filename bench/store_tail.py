"""A small job's latency on a SQLite store while large outputs are written:
one lane's worker returns N MiB of ``bytes`` job after job (the next pushed
as the last is answered), while a canary, a tiny job in a lane of its own,
is pushed and waited for every 100 ms. Measured: the canary's latency (push
to answer, p50 / p99 / max), and the large outputs stored per second; the
same mix in memory beside it, where nothing is written. Run alone:
``python -m bench.store_tail [--quick]``.

Target (issue: hours of mixed load): the canary's p99 under 50 ms while
large outputs commit to SQLite.
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench import standalone
from procq import Job, Lane, ProcQueue


def large(mib: int) -> bytes:
    return os.urandom(mib << 20)


def tiny(i: int) -> int:
    return i


def mix(mib: int, seconds: float, store: str | None) -> tuple[list[float], float]:
    """(the canary's latencies in ms, large outputs stored per second)."""
    latencies: list[float] = []
    stored = 0
    stop = threading.Event()
    lanes = {"large": Lane(workers=1), "canary": Lane(workers=1)}
    with ProcQueue(lanes, store=store) as q:
        q.push_and_wait(Job("warm", tiny, args=(0,), lane="canary"))

        def large_outputs() -> None:
            nonlocal stored
            while not stop.is_set():
                q.push_and_wait(Job(f"large{stored}", large, args=(mib,), lane="large"), timeout=120)
                stored += 1

        thread = threading.Thread(target=large_outputs)
        thread.start()
        began = time.monotonic()
        i = 0
        while time.monotonic() - began < seconds:
            pushed = time.perf_counter()
            q.push_and_wait(Job(f"canary{i}", tiny, args=(i,), lane="canary"), timeout=60)
            latencies.append((time.perf_counter() - pushed) * 1e3)
            i += 1
            time.sleep(0.1)
        stop.set()
        thread.join()
        took = time.monotonic() - began
    return latencies, stored / took


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(quick: bool) -> list[str]:
    sizes, seconds = ((1, 30), 8.0) if quick else ((1, 10, 30, 50), 20.0)
    lines = [
        f"# bench.store_tail: Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"{seconds:.0f} s a row",
        "",
        "| output, MiB | SQLite: canary p50 / p99 / max, ms | SQLite: large outputs/s "
        "| memory: canary p50 / p99 / max, ms | memory: large outputs/s |",
        "|---:|---:|---:|---:|---:|",
    ]
    worst = 0.0
    for mib in sizes:
        with tempfile.TemporaryDirectory() as directory:
            on_store, rate = mix(mib, seconds, str(Path(directory) / "run.db"))
        in_memory, memory_rate = mix(mib, seconds, None)
        worst = max(worst, _p(on_store, 0.99))
        cells = [f"{statistics.median(v):.1f} / {_p(v, 0.99):.1f} / {max(v):.1f}" for v in (on_store, in_memory)]
        lines.append(f"| {mib} | {cells[0]} | {rate:.1f} | {cells[1]} | {memory_rate:.1f} |")
    lines += [
        "",
        standalone.verdict(
            worst < 50, f"the canary's p99 under 50 ms while large outputs commit to SQLite: {worst:.1f} ms at worst"
        ),
    ]
    return lines


def main(argv: list[str] | None = None) -> None:
    standalone.main("store_tail", __doc__ or "", run, argv, "8 s a row, 1 and 30 MiB")


if __name__ == "__main__":
    main()
