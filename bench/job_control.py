"""Job control figures: how fast a time limit ends a job, and what an
untrusted lane costs on tiny jobs.

    python -m bench.job_control            # about 20 s here
    python -m bench.job_control --quick    # a few seconds

kill latency
    Each job writes ``time.monotonic()`` (CLOCK_MONOTONIC: one clock for every
    process on Linux) the moment it starts, then blocks forever; its ``timeout``
    is ``LIMIT``. The benchmark opens a pidfd on the worker and waits for it to
    become readable: the moment the worker process has exited. Latency is that
    moment less (start + LIMIT). Two kinds of job: one that lets SIGTERM end it
    (the usual case) and one that ignores SIGTERM, which only the SIGKILL after
    the lane's ``kill_grace`` (50 ms) ends. The target is the worker gone within
    100 ms of the deadline. A third figure is when the waiter is woken.

untrusted cost
    The same tiny workload (no-op jobs pushed one by one, a fresh key each,
    then every result awaited) and sequential push-and-wait latency, on a
    trusted lane and on an untrusted one (``Lane(trusted=False)``: each job
    runs in a process forked for it, which imports the job's module, and
    answers in JSON), in the same run, alternating. The job is
    ``bench.jobs.noop``, in a module that imports nothing heavy, so the figure
    is procq's cost, not an import's. Untrusted runs use fewer jobs: each
    costs a fork.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import select
import signal
import statistics
import time

from bench.jobs import noop
from procq import Job, JobFailed, Lane, ProcQueue

LIMIT = 0.2


def hold(report: str, ignore_term: bool) -> None:
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(report, "w") as f:
        f.write(f"{time.monotonic()!r} {os.getpid()}")
    while True:
        time.sleep(3600)


def _wait_exit(pid: int, limit: float) -> float:
    fd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([fd], [], [], limit)
        if not ready:
            raise RuntimeError(f"worker {pid} still alive {limit}s after its deadline")
        return time.monotonic()
    finally:
        os.close(fd)


def kill_latency(samples: int, ignore_term: bool, tmp: str) -> tuple[list[float], list[float]]:
    exits, wakes = [], []
    with ProcQueue({"k": Lane(workers=1, timeout=LIMIT)}) as q:
        q.push_and_wait(Job("warm", noop))  # the worker is up and has run a job
        for i in range(samples):
            report = os.path.join(tmp, f"start-{ignore_term}-{i}")
            handle = q.push(Job(f"hold-{ignore_term}-{i}", hold, args=(report, ignore_term))).handle
            while not os.path.exists(report) or os.path.getsize(report) == 0:
                # The job has not started yet; nothing to measure from. (A
                # benchmark may spin briefly here: no assertion depends on it.)
                time.sleep(0.001)
            with open(report) as f:
                started, pid = f.read().split()
            deadline = float(started) + LIMIT
            gone = _wait_exit(int(pid), 5.0)
            with contextlib.suppress(JobFailed):
                handle.result(timeout=5)
            woken = time.monotonic()
            exits.append((gone - deadline) * 1e3)
            wakes.append((woken - deadline) * 1e3)
    return exits, wakes


def tiny(trusted: bool, n: int) -> float:
    with ProcQueue({"t": Lane(workers=2, trusted=trusted, capacity=n)}) as q:
        for i in range(50):
            q.push_and_wait(Job(f"w{i}", noop))
        keys = [f"tiny-{i}" for i in range(n)]
        t0 = time.perf_counter()
        handles = [q.push(Job(k, noop)).handle for k in keys]  # type: ignore[union-attr]
        for h in handles:
            h.result()
        return n / (time.perf_counter() - t0)


def latency(trusted: bool, n: int) -> float:
    with ProcQueue({"t": Lane(workers=2, trusted=trusted)}) as q:
        for i in range(50):
            q.push_and_wait(Job(f"w{i}", noop))
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            q.push_and_wait(Job(f"lat-{i}", noop))
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    samples, n, lat_n, rounds = (5, 2000, 300, 1) if args.quick else (20, 10000, 2000, 3)
    # An untrusted job costs a fork: a few milliseconds, not microseconds.
    un, un_lat = max(50, n // 20), max(30, lat_n // 20)
    print(
        f"procq job control benchmark; {os.cpu_count()} CPUs, {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.platform()}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for ignore in (False, True):
            exits, wakes = kill_latency(samples, ignore, tmp)
            what = "job ignores SIGTERM (SIGKILL after 50 ms grace)" if ignore else "job ends on SIGTERM"
            print(
                f"kill latency, {what}, {samples} samples: worker gone p50 {statistics.median(exits):.1f} ms, "
                f"max {max(exits):.1f} ms; waiter woken p50 {statistics.median(wakes):.1f} ms, "
                f"max {max(wakes):.1f} ms  (target: gone within 100 ms: "
                f"{'met' if max(exits) <= 100 else 'MISSED'})"
            )
    rates: dict[bool, list[float]] = {True: [], False: []}
    lats: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for trusted in (True, False) if r % 2 == 0 else (False, True):
            rates[trusted].append(tiny(trusted, n if trusted else un))
            lats[trusted].append(latency(trusted, lat_n if trusted else un_lat))
    t, u = statistics.median(rates[True]), statistics.median(rates[False])
    tl, ul = statistics.median(lats[True]), statistics.median(lats[False])
    print(
        f"tiny ({n} / {un} jobs, medians of {rounds} rounds): trusted {t:,.0f} jobs/s, untrusted {u:,.0f} "
        f"jobs/s (untrusted/trusted {u / t:.3f})"
    )
    print(
        f"latency p50 ({lat_n} / {un_lat} samples): trusted {tl:.0f} us, untrusted {ul:.0f} us "
        f"(untrusted/trusted {ul / tl:.1f})"
    )


if __name__ == "__main__":
    main()
