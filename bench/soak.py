"""A soak: one queue with a trusted, an untrusted and a canary lane under a
steady mix for minutes, in memory or on a SQLite store, checked as it goes.

    python -m bench.soak                      # 5 minutes, in memory
    python -m bench.soak --minutes 5 --store  # the same on a SQLite store

The mix, from two threads and an asyncio task: tiny jobs, 50 ms jobs, numpy
results of 1-50 MB and ``bytes`` arguments of the same sizes, crashes
(``os._exit``, SIGKILL, a segfault), timeouts, cancels, re-pushes of
completed keys, and jobs with a 64 MiB ``memory_limit`` that allocate 16 MiB
(in the lane whose workers just returned the large results: they must pass).
Beside it a canary, a tiny job in a lane of its own every 100 ms.

Checked: every job ends as its kind must (a crash "crashed", a timeout
"timeout", a memory-limited job that fits completed, everything else
completed with the right output); the canary's p99 in each minute (target:
under 50 ms); the supervisor's RSS, open fds and mapped shared memory, sampled
every 5 s, do not grow from the second minute to the end beyond a bound (the
medians of the first and last thirds of those samples: a single sample may
fall on a 50 MB result in flight); after ``close()`` no worker and no
shared-memory segment of the queue is left.
Prints one line per minute and a verdict; exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from typing import Any

import numpy as np
import psutil

from procq import Job, JobFailed, Lane, ProcQueue

MIB = 1 << 20


# --- the jobs (run in the workers) ----------------------------------------------------------


def tiny(i: int) -> int:
    return i * 2


def nap(i: int) -> int:
    time.sleep(0.05)
    return i


def array(mib: int) -> Any:
    return np.full(mib * MIB, 7, dtype=np.uint8)


def length(data: bytes) -> int:
    return len(data)


def crash(how: str) -> None:
    if how == "exit":
        os._exit(3)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    ctypes.string_at(0)  # a segfault


def allocate(mib: int) -> int:
    block = bytearray(mib * MIB)
    time.sleep(0.05)
    return len(block)


# --- the soak (in the supervisor) ----------------------------------------------------------------


class Soak:
    def __init__(self, q: ProcQueue, seconds: float, seed: int) -> None:
        self.q = q
        self.until = time.monotonic() + seconds
        self.began = time.monotonic()
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.violations: list[str] = []
        self.counts: dict[str, int] = defaultdict(int)
        self.canary: dict[int, list[float]] = defaultdict(list)  # minute -> ms
        self.samples: list[tuple[float, int, int, int]] = []  # (t, rss, fds, shm)
        self.n = 0

    def key(self, what: str) -> str:
        with self.lock:
            self.n += 1
            return f"{what}-{self.n}"

    def violation(self, text: str) -> None:
        with self.lock:
            self.violations.append(text)

    def expect(self, job: Job, kind: str | None, output: Any = None, timeout: float = 120) -> None:
        """Push ``job``, wait, and check how it ended (``kind`` None: completed with ``output``)."""
        with self.lock:
            self.counts[job.fn.__name__] += 1
        try:
            got = self.q.push_and_wait(job, timeout=timeout)
        except JobFailed as exc:
            if exc.failure.kind != kind and exc.failure.kind != "cancelled":
                self.violation(f"{job.key}: failed {exc.failure.kind} ({exc.failure.message[:200]}), expected {kind}")
            return
        if kind is not None:
            self.violation(f"{job.key}: completed, expected {kind}")
        elif output is not None and not (got == output if not isinstance(got, np.ndarray) else got.nbytes == output):
            self.violation(f"{job.key}: output {str(got)[:80]}, expected {output}")

    def mix(self) -> None:
        r = self.random
        while time.monotonic() < self.until:
            pick = r.random()
            if pick < 0.35:
                i = r.randrange(1000)
                self.expect(Job(self.key("tiny"), tiny, args=(i,)), None, i * 2)
            elif pick < 0.45:
                self.expect(Job(self.key("nap"), nap, args=(1,), lane="untrusted"), None, 1)
            elif pick < 0.55:
                mib = r.choice((1, 8, 50))
                key = self.key("array")
                self.expect(Job(key, array, args=(mib,)), None, mib * MIB)
                self.q.forget(key)  # (a kept result keeps its mapping: the soak measures what is not kept)
                # A job with a memory limit right after, in the lane whose worker holds that result's segment.
                self.expect(Job(self.key("limited"), allocate, args=(16,), memory_limit="64M"), None, 16 * MIB)
            elif pick < 0.62:
                data = os.urandom(r.choice((1, 8, 50)) * MIB)
                self.expect(Job(self.key("bytes"), length, args=(data,)), None, len(data))
            elif pick < 0.70:
                how = r.choice(("exit", "kill", "segv"))
                lane = r.choice(("trusted", "untrusted"))
                self.expect(Job(self.key("crash"), crash, args=(how,), lane=lane), "crashed")
            elif pick < 0.75:
                self.expect(Job(self.key("timeout"), nap, args=(0,), timeout=0.01, lane="untrusted"), "timeout")
            elif pick < 0.82:
                key = self.key("cancel")
                handle = self.q.push(Job(key, nap, args=(2,))).handle
                self.q.cancel(key)
                if handle is not None:
                    try:
                        handle.result(timeout=60)
                    except JobFailed as exc:
                        if exc.failure.kind != "cancelled":
                            self.violation(f"{key}: {exc.failure.kind}, expected cancelled")
            else:
                i = r.randrange(50)  # a small set of keys: most pushes find them completed
                self.expect(Job(f"again-{i}", tiny, args=(i,)), None, i * 2)

    async def asynchronous(self) -> None:
        while time.monotonic() < self.until:
            i = self.random.randrange(1000)
            got = await self.q.apush_and_wait(Job(self.key("async"), tiny, args=(i,)), timeout=60)
            if got != i * 2:
                self.violation(f"async job: {got}, expected {i * 2}")
            await asyncio.sleep(0.01)

    def canary_loop(self) -> None:
        while time.monotonic() < self.until:
            began = time.monotonic()
            try:
                self.q.push_and_wait(Job(self.key("canary"), tiny, args=(1,), lane="canary"), timeout=60)
            except Exception as exc:
                self.violation(f"canary: {exc!r}")
            took = time.monotonic() - began
            self.canary[int((began - self.began) // 60)].append(took * 1e3)
            time.sleep(max(0.0, 0.1 - took))

    def sample_loop(self) -> None:
        me = psutil.Process()
        while time.monotonic() < self.until:
            shm = 0
            for region in me.memory_maps(grouped=False):
                if region.path.startswith("/dev/shm/"):
                    shm += region.rss
            self.samples.append((time.monotonic() - self.began, me.memory_info().rss, me.num_fds(), shm))
            time.sleep(5)


def run(minutes: float, store: bool, seed: int) -> int:
    lanes = {
        "trusted": Lane(workers=2),
        "untrusted": Lane(workers=1, trusted=False),
        "canary": Lane(workers=1),
    }
    directory = tempfile.mkdtemp(prefix="procq-soak-")
    url = f"sqlite:///{directory}/soak.db" if store else None
    q = ProcQueue(lanes, **({"store": url} if url else {}))
    pids: list[int] = []
    prefix = f"procq-{os.getpid()}-"
    try:
        soak = Soak(q, minutes * 60, seed)
        threads = [threading.Thread(target=f, daemon=True) for f in (soak.mix, soak.mix, soak.canary_loop,
                                                                      soak.sample_loop)]  # fmt: skip
        threads.append(threading.Thread(target=lambda: asyncio.run(soak.asynchronous()), daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join(minutes * 60 + 300)
        pids = q._worker_pids()
    finally:
        q.close()
        shutil.rmtree(directory, ignore_errors=True)
    left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    segments = [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
    if left:
        soak.violations.append(f"workers left after close: {left}")
    if segments:
        soak.violations.append(f"shared-memory segments left after close: {segments}")
    print(f"# bench.soak: {minutes:g} min, {'SQLite store' if store else 'in memory'}, seed {seed}; "
          f"jobs by kind: {dict(sorted(soak.counts.items()))}")  # fmt: skip
    worst = 0.0
    for minute, times in sorted(soak.canary.items()):
        times.sort()
        p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
        worst = max(worst, p99)
        print(f"minute {minute + 1}: canary n={len(times)} p50 {statistics.median(times):.1f} ms, "
              f"p99 {p99:.1f} ms, max {times[-1]:.1f} ms")  # fmt: skip
    later = [s for s in soak.samples if s[0] >= 60] or soak.samples
    if later:
        # The median of the first and of the last third of the samples from the
        # second minute on: a sample falls where it falls in the mix, often with
        # a 50 MB result or two mapped, and two single samples differ by that
        # much with nothing held; a slope moves the medians.
        third = max(1, len(later) // 3)
        first, last = (tuple(statistics.median(s[i] for s in part) for i in range(4)) for part in
                       (later[:third], later[-third:]))  # fmt: skip
        grew = (last[1] - first[1]) / MIB, int(last[2] - first[2]), (last[3] - first[3]) / MIB
        print(f"from the first third of {later[0][0]:.0f}-{later[-1][0]:.0f} s to its last (medians): "
              f"RSS {grew[0]:+.1f} MiB, fds {grew[1]:+d}, shared memory mapped {grew[2]:+.1f} MiB")  # fmt: skip
        if grew[0] > 64 or grew[1] > 8 or grew[2] > 128:
            soak.violations.append(f"resources grew: RSS {grew[0]:+.1f} MiB, fds {grew[1]:+d}, shm {grew[2]:+.1f} MiB")
    print(f"[{'MET' if worst < 50 else 'MISSED'}] canary p99 under 50 ms in every minute: worst {worst:.1f} ms")
    for text in soak.violations[:20]:
        print(f"VIOLATION {text}")
    print(f"{len(soak.violations)} violations")
    return 1 if soak.violations else 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--store", action="store_true", help="on a SQLite store (in a temporary directory)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    sys.exit(run(args.minutes, args.store, args.seed))


if __name__ == "__main__":
    main()
