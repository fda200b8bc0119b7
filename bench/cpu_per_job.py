"""``python -m bench.cpu_per_job {procq,floor} {tiny,latency}``: CPU per job, per thread and process.

Runs 20,000 tiny jobs (or 3,000 sequential ones) through procq or the raw pipe
floor and prints, from ``/proc``, the CPU (user + system) each supervisor thread
and each worker spent per job: the numbers behind "Where the time goes" in
bench/RESULTS.md, measured with no profiler attached. Run it under
``py-spy record --threads --gil -f raw`` to see where the GIL time goes.
"""

from __future__ import annotations

import os
import sys
import time

import psutil

from bench import jobs
from bench.engines import FloorEngine, ProcqEngine, ensure_forkserver, warm

TICK = os.sysconf("SC_CLK_TCK")


def _cpu(stat_path: str) -> float:
    with open(stat_path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _threads() -> dict[str, float]:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        name = "main thread" if int(tid) == os.getpid() else f"thread {tid}"
        out[name] = _cpu(f"/proc/self/task/{tid}/stat")
    return out


def _children() -> dict[str, float]:
    return {f"child {p.pid}": _cpu(f"/proc/{p.pid}/stat") for p in psutil.Process().children(recursive=True)}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("procq", "floor") or argv[1] not in ("tiny", "latency"):
        print(__doc__)
        return 2
    which, work = argv
    ensure_forkserver()
    e = ProcqEngine(2) if which == "procq" else FloorEngine(2)
    try:
        warm(e, 2, 500)
        n = 20_000 if work == "tiny" else 3_000
        before = {**_threads(), **_children()}
        t0 = time.perf_counter()
        if work == "tiny":
            futures = [e.submit(jobs.noop) for _ in range(n)]
            for f in futures:
                e.result(f, 60.0)
        else:
            for _ in range(n):
                e.result(e.submit(jobs.noop), 60.0)
        wall = time.perf_counter() - t0
        after = {**_threads(), **_children()}
    finally:
        e.close()
    print(f"{which} {work}: {n:,} jobs, {wall * 1e6 / n:.1f} us wall per job ({n / wall:,.0f} jobs/s)")
    for name, cpu in after.items():
        spent = cpu - before.get(name, cpu)
        if spent > 0:
            print(f"  {name:<16} CPU {spent * 1e6 / n:6.1f} us/job ({spent / wall:.0%} of wall)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
