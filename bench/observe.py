"""``python -m bench.observe``: what watching a queue costs its tiny-job throughput.

Three ways to run the same tiny workload (no-op jobs pushed one by one, a
fresh key each, on 2 workers, then every handle awaited), interleaved in
rotating order over ``--rounds`` rounds so that the host's drift hits all
alike:

- ``off``: ``ProcQueue(...)``, nobody reading its metrics (the counters are
  always kept: this is their cost when nobody reads them);
- ``monitor``: ``ProcQueue(..., monitor=True)`` with a Prometheus collector
  registered, nobody reading;
- ``watched``: the same, read the whole time: a ``procq top --once --json``
  client on the socket and a Prometheus scrape, every 0.1 s.

Each figure is the median of its rounds; the ratios are the medians of each
round's own ratio to ``off`` (adjacent runs: what the drift moves least).
The cost of the counters themselves against procq before them is measured
with ``python -m bench.ab BEFORE AFTER --only tiny``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from bench.jobs import noop
from procq import Job, Lane, ProcQueue

MODES = ("off", "monitor", "watched")


@contextmanager
def _readers(q: ProcQueue, every: float) -> Iterator[list[int]]:
    """Read ``q`` through its socket and a Prometheus scrape every ``every`` seconds; yields the count of reads."""
    from procq._monitor import fetch, find

    try:
        from prometheus_client import CollectorRegistry, generate_latest

        from procq.metrics import prometheus
    except ImportError:  # (the socket alone, then)
        registry = None
    else:
        registry = CollectorRegistry()
        prometheus.register(q, registry)
    (path,) = find(os.getpid())
    stop = threading.Event()
    reads = [0]

    def read() -> None:
        while True:
            fetch(path)
            if registry is not None:
                generate_latest(registry)
            reads[0] += 1
            if stop.wait(every):
                return

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        yield reads
    finally:
        stop.set()
        thread.join()


def tiny(mode: str, n: int) -> float:
    """Jobs per second for ``n`` tiny jobs in one of ``MODES``."""
    lanes = {"t": Lane(workers=2, capacity=n)}
    with ProcQueue(lanes, monitor=mode != "off", name=f"bench-{mode}") as q:
        for i in range(50):
            q.push_and_wait(Job(f"w{i}", noop))
        keys = [f"tiny-{i}" for i in range(n)]
        with _readers(q, 0.1) if mode == "watched" else _nothing() as reads:
            t0 = time.perf_counter()
            handles = [q.push(Job(k, noop)).handle for k in keys]  # type: ignore[union-attr]
            for h in handles:
                h.result()
            took = time.perf_counter() - t0
        if mode == "watched":
            assert reads[0] > 0, "nobody read the queue during the run"
        return n / took


@contextmanager
def _nothing() -> Iterator[list[int]]:
    yield [0]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.observe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2,000 jobs (a smoke test)")
    args = parser.parse_args()
    rounds, n = (2, 2000) if args.quick else (args.rounds, args.jobs)
    print(
        f"procq observability cost; {os.cpu_count()} CPUs, {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.platform()}; load before: {os.getloadavg()[0]:.2f}"
    )
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(rounds):
        order = MODES[r % 3 :] + MODES[: r % 3]
        for mode in order:
            rates[mode].append(tiny(mode, n))
        line = ", ".join(f"{m} {rates[m][-1]:,.0f}" for m in MODES)
        print(f"round {r + 1}/{rounds}: jobs/s {line}; load {os.getloadavg()[0]:.2f}", flush=True)
    off = statistics.median(rates["off"])
    print(f"tiny ({n:,} jobs, medians of {rounds} rounds): off {off:,.0f} jobs/s")
    for mode in MODES[1:]:
        ratio = statistics.median(x / o for x, o in zip(rates[mode], rates["off"], strict=True))
        print(f"  {mode}: {statistics.median(rates[mode]):,.0f} jobs/s, x{ratio:.3f} of off (per-round ratios)")
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
