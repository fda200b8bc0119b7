"""Key retention memory: what a kept key costs the supervisor, and
that bounded retention keeps that memory flat while new keys keep arriving.

    python -m bench.memory            # 1,000,000 keys per run (a few minutes)
    python -m bench.memory --quick    # 20,000 keys (a few seconds)

Two runs, each in a fresh child process (so one run's heap does not flatter
the next), each pushing ``keys`` distinct keys whose jobs return a small int
through a queue with 2 workers:

- ``forever``: the default retention. Memory per kept key is the growth of
  the supervisor's RSS divided by the number of keys.
- ``bounded``: ``Retention(max_completed=10_000)``. RSS is sampled at every
  tenth of the run; once the first 10,000 keys are in, it should stay flat.

RSS is the supervisor's (this child's) resident set, from psutil; the worker
processes are not counted. Keys are pushed in batches (``push_all``) and each
batch is waited for, so at most one batch is in flight.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import sys
import time
from typing import Any

BATCH = 2_000
BOUND = 10_000


def small(i: int) -> int:
    return i


def _run(kind: str, keys: int, out: Any) -> None:
    import gc

    import psutil

    from procq import Job, ProcQueue, Retention

    me = psutil.Process()
    retention = Retention(max_completed=BOUND) if kind == "bounded" else None
    samples: list[tuple[int, int]] = []
    with ProcQueue(2, retention=retention) as q:
        q.push_and_wait(Job("warm", small, args=(0,)))
        gc.collect()
        base = me.memory_info().rss
        start = time.perf_counter()
        step = max(keys // 10, BATCH)
        for first in range(0, keys, BATCH):
            outcomes = q.push_all([Job(f"key:{i}", small, args=(i,)) for i in range(first, min(first + BATCH, keys))])
            for o in outcomes:
                o.handle.result()  # type: ignore[union-attr]
            done = min(first + BATCH, keys)
            if done % step == 0 or done == keys:
                samples.append((done, me.memory_info().rss))
        elapsed = time.perf_counter() - start
        stats = q.stats()
    out.send({"base": base, "samples": samples, "kept": stats.completed, "elapsed": elapsed})


def measure(kind: str, keys: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_run, args=(kind, keys, child))
    proc.start()
    child.close()
    result: dict[str, Any] = parent.recv()
    proc.join()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 keys instead of 1,000,000")
    parser.add_argument("--keys", type=int, default=None, help="keys per run")
    args = parser.parse_args(argv)
    keys = args.keys or (20_000 if args.quick else 1_000_000)
    mib = 1024 * 1024
    print("procq key retention memory: supervisor RSS (psutil), 2 workers, small int outputs")
    print(f"machine: {os.cpu_count()} CPUs; CPython {platform.python_version()}; {platform.platform()}")
    print(f"keys per run: {keys:,}; batches of {BATCH:,}; bounded run: Retention(max_completed={BOUND:,})")
    print()
    forever = measure("forever", keys)
    grown = forever["samples"][-1][1] - forever["base"]
    print(f"{'run':<10} {'keys':>10} {'kept':>10} {'RSS growth':>12} {'per kept key':>13} {'keys/s':>9}")
    print(
        f"{'forever':<10} {keys:>10,} {forever['kept']:>10,} {grown / mib:>9.1f} MiB "
        f"{grown / max(forever['kept'], 1):>9.0f} B   {keys / forever['elapsed']:>9,.0f}"
    )
    bounded = measure("bounded", keys)
    grown_b = bounded["samples"][-1][1] - bounded["base"]
    print(
        f"{'bounded':<10} {keys:>10,} {bounded['kept']:>10,} {grown_b / mib:>9.1f} MiB "
        f"{'':>13} {keys / bounded['elapsed']:>9,.0f}"
    )
    print()
    print("RSS growth over the base as keys arrive (MiB):")
    print(f"{'keys pushed':>12} {'forever':>10} {'bounded':>10}")
    for (n, rss_f), (_, rss_b) in zip(forever["samples"], bounded["samples"], strict=False):
        print(f"{n:>12,} {(rss_f - forever['base']) / mib:>10.1f} {(rss_b - bounded['base']) / mib:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
