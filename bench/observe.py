"""``python -m bench.observe``: what watching a queue costs its tiny-job throughput.

Three ways to run the same tiny workload (no-op jobs pushed one by one, a
fresh key each, on 2 workers, then every handle awaited), interleaved in
rotating order over ``--rounds`` rounds so that the host's drift hits all
alike:

- ``off``: ``ProcQueue(...)``, nobody reading its metrics (the counters are
  always kept: this is their cost when nobody reads them);
- ``monitor``: ``ProcQueue(..., monitor=True)``, nobody reading;
- ``watched``: the same, with a Prometheus endpoint (``serve``), both read
  the whole time by another process: a snapshot from the socket (what
  ``procq top`` reads) and a scrape, every ``--every`` seconds (1 by default:
  ``procq top``'s refresh, and a scrape 15 times as often as Prometheus'
  usual; 0.1 for a stress test).

Two figures per run: jobs per second (wall), and this process's CPU time per
job (every thread of the queue's side, the monitor's and the endpoint's
included), which a busy shared machine disturbs far less than the wall
clock. Each is the median of its rounds; the ratios are the medians of each
round's own ratio to ``off`` (adjacent runs: what the drift moves least).
The cost of the counters themselves against procq before them is measured
with ``python -m bench.ab BEFORE AFTER --only tiny``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from bench.jobs import noop
from procq import Job, Lane, ProcQueue

MODES = ("off", "monitor", "watched")


#: The reader, in a process of its own: a snapshot from the socket and a scrape, every N seconds, until stdin closes.
_READER = """
import select, sys, urllib.request
from procq._monitor import fetch
path, url, every = sys.argv[1], sys.argv[2], float(sys.argv[3])
reads = 0
while True:
    fetch(path)
    urllib.request.urlopen(url, timeout=10).read()
    reads += 1
    if select.select([sys.stdin], [], [], every)[0]:
        break
print(reads)
"""


@contextmanager
def _readers(q: ProcQueue, every: float) -> Iterator[list[int]]:
    """Another process reads ``q`` (see ``_READER``) while the block runs; yields, after it, how many reads it made."""
    from procq._monitor import find
    from procq.metrics import prometheus

    server, thread = prometheus.serve(q, port=0)
    url = f"http://127.0.0.1:{server.server_port}/metrics"  # type: ignore[attr-defined]
    (path,) = find(os.getpid())
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    reader = subprocess.Popen(
        [sys.executable, "-c", _READER, path, url, str(every)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    reads = [0]
    try:
        yield reads
    finally:
        out, _ = reader.communicate("stop\n", timeout=60)
        reads[0] = int(out.strip() or 0)
        server.shutdown()  # type: ignore[attr-defined]
        server.server_close()  # type: ignore[attr-defined]
        thread.join()  # type: ignore[attr-defined]


def tiny(mode: str, n: int, every: float) -> tuple[float, float]:
    """Jobs per second, and this process's CPU microseconds per job, for ``n`` tiny jobs in one of ``MODES``."""
    lanes = {"t": Lane(workers=2, capacity=n)}
    with ProcQueue(lanes, monitor=mode != "off", name=f"bench-{mode}") as q:
        for i in range(50):
            q.push_and_wait(Job(f"w{i}", noop))
        keys = [f"tiny-{i}" for i in range(n)]
        with _readers(q, every) if mode == "watched" else _nothing() as reads:
            t0, c0 = time.perf_counter(), time.process_time()
            handles = [q.push(Job(k, noop)).handle for k in keys]  # type: ignore[union-attr]
            for h in handles:
                h.result()
            took, cpu = time.perf_counter() - t0, time.process_time() - c0
        if mode == "watched":
            assert reads[0] > 0, "nobody read the queue during the run"
        return n / took, cpu / n * 1e6


@contextmanager
def _nothing() -> Iterator[list[int]]:
    yield [0]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.observe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--every", type=float, default=1.0, help="seconds between the watcher's reads (default 1)")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2,000 jobs (a smoke test)")
    args = parser.parse_args()
    rounds, n = (2, 2000) if args.quick else (args.rounds, args.jobs)
    print(
        f"procq observability cost; {os.cpu_count()} CPUs, {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.platform()}; watched: read every {args.every:g} s; "
        f"load before: {os.getloadavg()[0]:.2f}"
    )
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    cpus: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(rounds):
        order = MODES[r % 3 :] + MODES[: r % 3]
        for mode in order:
            rate, cpu = tiny(mode, n, args.every)
            rates[mode].append(rate)
            cpus[mode].append(cpu)
        line = ", ".join(f"{m} {rates[m][-1]:,.0f} jobs/s {cpus[m][-1]:.1f} us/job" for m in MODES)
        print(f"round {r + 1}/{rounds}: {line}; load {os.getloadavg()[0]:.2f}", flush=True)
    off, off_cpu = statistics.median(rates["off"]), statistics.median(cpus["off"])
    print(f"tiny ({n:,} jobs, medians of {rounds} rounds): off {off:,.0f} jobs/s, {off_cpu:.1f} us CPU/job")
    for mode in MODES[1:]:
        ratio = statistics.median(x / o for x, o in zip(rates[mode], rates["off"], strict=True))
        cpu_ratio = statistics.median(o / x for x, o in zip(cpus[mode], cpus["off"], strict=True))
        print(
            f"  {mode}: {statistics.median(rates[mode]):,.0f} jobs/s, x{ratio:.3f} of off; "
            f"{statistics.median(cpus[mode]):.1f} us CPU/job, x{cpu_ratio:.3f} of off's jobs per CPU second"
        )
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
