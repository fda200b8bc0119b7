"""``python -m bench.dask [--jobs N] [--concurrency C]``: a Dask lane against
plain ``client.submit`` on the same cluster, and against a local lane.

One run, one cluster: ``LocalCluster(n_workers=2, threads_per_worker=2,
processes=True)`` on this machine, the scheduler with ``allowed-failures`` 0
(as a ``DaskLane`` requires). For each engine, with the same tiny function:

- jobs/s: ``--jobs`` jobs, at most ``--concurrency`` in flight at once (a
  ``DaskLane(workers=C)``; ``client.submit`` kept C deep with
  ``as_completed``; a local ``Lane(workers=C)``);
- p50 latency: one job at a time, from the push (or submit) to its result.

And the cost of procq's isolation per job, taken apart: ``client.submit`` of
``_cluster.remote.run_job`` (the Dask task a lane submits, which hands the job
to a procq worker process on the Dask worker and watches it) against
``client.submit`` of the function itself is the far side's cost; the lane
against that bare ``run_job`` is the supervisor's side (keys, the slot, the
event loop hop). Engines run interleaved, ``--rounds`` times; medians print.
"""

from __future__ import annotations

import argparse
import itertools
import os
import pickle
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.jobs import inc as square


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Bench:
    def __init__(self, jobs: int, concurrency: int) -> None:
        import dask
        from distributed import Client, LocalCluster

        dask.config.set({"distributed.scheduler.allowed-failures": 0})
        self.cluster = LocalCluster(
            n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0", silence_logs=50
        )
        self.client = Client(self.cluster, set_as_default=False)
        self.jobs = jobs
        self.concurrency = concurrency
        self.serial = itertools.count()
        from procq import DaskLane, Lane, ProcQueue

        self.queue = ProcQueue(
            {
                "cluster": DaskLane(self.client, workers=concurrency),
                "local": Lane(workers=concurrency),
            }
        )
        self._warm()

    def close(self) -> None:
        self.queue.close()
        self.client.close()
        self.cluster.close()

    def _warm(self) -> None:
        for lane in ("cluster", "local"):
            self._procq_rate(lane, 4 * self.concurrency)
        self._submit_rate(square, 4 * self.concurrency)

    # --- engines -------------------------------------------------------------------

    def _key(self) -> str:
        return f"b{next(self.serial)}"

    def _procq_rate(self, lane: str, n: int) -> float:
        from procq import Job

        start = time.perf_counter()
        handles = [self.queue.push(Job(self._key(), square, args=(i,), lane=lane)).handle for i in range(n)]
        for h in handles:
            h.result()
        return n / (time.perf_counter() - start)

    def _procq_latency(self, lane: str, n: int) -> float:
        from procq import Job

        times = []
        for i in range(n):
            start = time.perf_counter()
            self.queue.push_and_wait(Job(self._key(), square, args=(i,), lane=lane))
            times.append(time.perf_counter() - start)
        return _percentile(times, 0.5)

    def _submit_rate(
        self, fn: Callable[..., Any], n: int, args: Callable[[int], tuple[Any, ...]] | None = None
    ) -> float:
        from distributed import as_completed

        make = args or (lambda i: (i,))
        start = time.perf_counter()
        first = [self.client.submit(fn, *make(i), pure=False) for i in range(min(n, self.concurrency))]
        sent = len(first)
        done = as_completed(first, loop=self.client.loop)
        for future in done:
            future.result()
            if sent < n:
                done.add(self.client.submit(fn, *make(sent), pure=False))
                sent += 1
        return n / (time.perf_counter() - start)

    def _submit_latency(
        self, fn: Callable[..., Any], n: int, args: Callable[[int], tuple[Any, ...]] | None = None
    ) -> float:
        make = args or (lambda i: (i,))
        times = []
        for i in range(n):
            start = time.perf_counter()
            self.client.submit(fn, *make(i), pure=False).result()
            times.append(time.perf_counter() - start)
        return _percentile(times, 0.5)

    def _run_job_args(self) -> Callable[[int], tuple[Any, ...]]:
        """The arguments a lane gives ``run_job``, for a bare submit of it."""
        from procq._cluster.channel import _remote_config
        from procq._cluster.lane import DaskLane
        from procq._wire.protocol import digest, dumps_fn

        fn_bytes = dumps_fn(square)
        fn_id = digest(fn_bytes)
        config = _remote_config(DaskLane(self.client))
        pool = f"bench-{os.getpid()}"

        def make(i: int) -> tuple[Any, ...]:
            job = (i, fn_id, fn_bytes, pickle.dumps(((i,), None), -1), None)
            return (pool, config, f"bench-{next(self.serial)}", job, None, 0.05)

        return make

    def run(self, rounds: int) -> dict[str, dict[str, float]]:
        from procq._cluster.remote import run_job

        n, lat = self.jobs, max(50, self.jobs // 8)
        run_job_args = self._run_job_args()
        engines: dict[str, tuple[Callable[[], float], Callable[[], float]]] = {
            "client.submit(fn)": (lambda: self._submit_rate(square, n), lambda: self._submit_latency(square, lat)),
            "client.submit(run_job)": (
                lambda: self._submit_rate(run_job, n, run_job_args),
                lambda: self._submit_latency(run_job, lat, run_job_args),
            ),
            "procq DaskLane": (lambda: self._procq_rate("cluster", n), lambda: self._procq_latency("cluster", lat)),
            "procq local Lane": (lambda: self._procq_rate("local", n), lambda: self._procq_latency("local", lat)),
        }
        rates: dict[str, list[float]] = {name: [] for name in engines}
        p50s: dict[str, list[float]] = {name: [] for name in engines}
        names = list(engines)
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:  # who goes first rotates
                rate, latency = engines[name]
                rates[name].append(rate())
                p50s[name].append(latency())
        return {
            name: {"jobs/s": statistics.median(rates[name]), "p50 ms": 1000 * statistics.median(p50s[name])}
            for name in names
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dask")
    parser.add_argument("--jobs", type=int, default=400, help="jobs per throughput run (default 400)")
    parser.add_argument("--concurrency", type=int, default=4, help="jobs in flight at once (default 4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every engine (default 3)")
    args = parser.parse_args(argv)
    bench = Bench(args.jobs, args.concurrency)
    try:
        results = bench.run(args.rounds)
    finally:
        bench.close()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(
        f"cluster: LocalCluster(n_workers=2, threads_per_worker=2, processes=True); {args.jobs} jobs per rate, "
        f"{args.concurrency} in flight; medians of {args.rounds} rounds"
    )
    print(f"{'engine':<24}{'jobs/s':>10}{'p50 ms':>10}")
    for name, row in results.items():
        print(f"{name:<24}{row['jobs/s']:>10.0f}{row['p50 ms']:>10.2f}")
    bare, hop, lane = (results[k]["p50 ms"] for k in ("client.submit(fn)", "client.submit(run_job)", "procq DaskLane"))
    print(f"isolation per job, far side (run_job - fn, p50): {hop - bare:+.2f} ms")
    print(f"supervisor side (DaskLane - run_job, p50):       {lane - hop:+.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
