"""What callers waiting on one job cost: N threads wait on the handle of a
job that sleeps 3 s (one of them reads the worker's answer itself, see
``procq._supervisor.lead``; the others wait to be woken). Measured: the
supervisor process's CPU while they wait (1.5 s of the wait, from its own
``getrusage``), and how long after the job returned (the worker's clock)
the first and the last of them had its output. Beside it, the same number
of threads waiting on one ``threading.Event`` set by another thread: what
waking that many threads costs this interpreter on this machine, procq
aside. Run alone: ``python -m bench.waiters [--quick]``.

Targets (issue: cost stays flat as the work grows): 1,000 waiting threads
cost the supervisor under 5% CPU; they are all woken within 50 ms of the
job's return.
"""

from __future__ import annotations

import os
import platform
import resource
import threading
import time

from bench import standalone
from procq import Job, Lane, ProcQueue


def sleepy(seconds: float) -> float:
    """In the worker: sleep, then say when it returned (wall clock)."""
    time.sleep(seconds)
    return time.time()


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def procq_waiters(n: int) -> tuple[float, float, float]:
    """(CPU share while waiting, ms to the first, ms to the last woken)."""
    woke: list[float] = []
    with ProcQueue({"a": Lane(workers=1)}) as q:
        q.push_and_wait(Job("warm", sleepy, args=(0.0,)))
        handle = q.push(Job(f"k{n}", sleepy, args=(3.0,))).handle  # type: ignore[union-attr]

        def wait() -> None:
            handle.result(timeout=60)
            woke.append(time.time())

        threads = [threading.Thread(target=wait) for _ in range(n)]
        for thread in threads:
            thread.start()
        time.sleep(0.5)
        cpu, began = _cpu(), time.monotonic()
        time.sleep(1.5)
        share = (_cpu() - cpu) / (time.monotonic() - began)
        for thread in threads:
            thread.join()
        ended = handle.result()
    return share, (min(woke) - ended) * 1e3, (max(woke) - ended) * 1e3


def event_waiters(n: int) -> float:
    """ms from ``Event.set()`` to the last of ``n`` waiting threads running."""
    event, woke = threading.Event(), []

    def wait() -> None:
        event.wait(60)
        woke.append(time.perf_counter())

    threads = [threading.Thread(target=wait) for _ in range(n)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    began = time.perf_counter()
    event.set()
    for thread in threads:
        thread.join()
    return (max(woke) - began) * 1e3


def run(quick: bool) -> list[str]:
    counts = (1, 100, 1000) if quick else (1, 10, 100, 1000, 3000)
    lines = [
        f"# bench.waiters: Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs",
        "",
        "| waiting threads | supervisor CPU while waiting | first woken, ms | last woken, ms "
        "| threading.Event alone: last woken, ms |",
        "|---:|---:|---:|---:|---:|",
    ]
    figures = {}
    for n in counts:
        share, first, last = procq_waiters(n)
        figures[n] = (share, last)
        lines.append(f"| {n:,} | {share * 100:.1f}% | {first:.1f} | {last:.1f} | {event_waiters(n):.1f} |")
    share, last = figures[1000]
    lines += [
        "",
        standalone.verdict(share < 0.05, f"1,000 waiters cost the supervisor under 5% CPU: {share * 100:.1f}%"),
        standalone.verdict(last < 50, f"1,000 waiters all woken within 50 ms of the job's return: {last:.0f} ms"),
    ]
    return lines


def main(argv: list[str] | None = None) -> None:
    standalone.main("waiters", __doc__ or "", run, argv, "fewer thread counts")


if __name__ == "__main__":
    main()
