"""``python -m bench.observe``: what watching a queue costs its tiny-job throughput.

Two queues in this process, 2 workers each, run the same tiny workload in
alternating batches (no-op jobs pushed one by one, a fresh key each, then
every handle awaited; ``--batch`` jobs a batch, ``--pairs`` pairs, the order
within a pair alternating), so that a busy shared machine's drift hits both
alike within a fraction of a second:

- ``off``: ``ProcQueue(...)``: no monitor, nobody reading (the counters are
  always kept: what they cost is measured against procq before them with
  ``python -m bench.ab BEFORE AFTER --only tiny cached``);
- ``watched``: ``ProcQueue(..., monitor=True)`` with a Prometheus endpoint
  (``procq.metrics.prometheus.serve``), read by another process: a snapshot
  from the socket (what ``procq top`` reads) and a scrape, once every
  ``--every`` seconds of this queue's own running time (1 by default:
  ``procq top``'s refresh, and a scrape 15 times as often as Prometheus'
  usual; 0.1 for a stress test). The reads are asked for at the start of a
  batch and run alongside it.

Reported: each queue's jobs per second over all its batches, and the median
of the pairs' ratios, watched / off. The two queues are not quite alike (the
one opened second, say, may start its workers on a less busy core): run it
with ``--watched-first`` too, and ``--control`` (the watched queue's monitor
on but never read: an A/A run) to see how large that difference is.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

from bench.jobs import noop
from procq import Job, Lane, ProcQueue

#: The reader, in a process of its own: on each line "read", one snapshot from
#: the socket and one scrape, then "done"; it prints how many it made at EOF.
_READER = """
import sys, urllib.request
from procq._api.monitor import fetch
path, url = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    fetch(path)
    urllib.request.urlopen(url, timeout=10).read()
    print("done", flush=True)
"""


class Reader:
    """The other process that reads the watched queue, one read when asked."""

    def __init__(self, q: ProcQueue) -> None:
        from procq._api.monitor import find
        from procq.metrics import prometheus

        self._server, self._thread = prometheus.serve(q, port=0)
        url = f"http://127.0.0.1:{self._server.server_port}/metrics"  # type: ignore[attr-defined]
        (path,) = [p for p in find(os.getpid()) if p.endswith(".bench-watched.sock")]
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _READER, path, url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.asked = self.reads = 0

    def ask(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write("read\n")
        self._proc.stdin.flush()
        self.asked += 1

    def collect(self) -> None:
        """Wait for every read asked for (between batches: no read overlaps the other queue's)."""
        assert self._proc.stdout is not None
        while self.reads < self.asked:
            assert self._proc.stdout.readline() == "done\n", "the reader failed"
            self.reads += 1

    def close(self) -> None:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.close()
        self._proc.wait(timeout=60)
        self._proc.stdout.close()
        self._server.shutdown()  # type: ignore[attr-defined]
        self._server.server_close()  # type: ignore[attr-defined]
        self._thread.join()  # type: ignore[attr-defined]


def batch(q: ProcQueue, keys: list[str]) -> float:
    """Seconds to push ``keys`` as tiny jobs and await them all."""
    t0 = time.perf_counter()
    handles = [q.push(Job(k, noop)).handle for k in keys]  # type: ignore[union-attr]
    for h in handles:
        h.result()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.observe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=150)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--every", type=float, default=1.0, help="seconds of run time between reads (default 1)")
    parser.add_argument("--quick", action="store_true", help="10 pairs of 500 jobs (a smoke test)")
    parser.add_argument("--control", action="store_true", help="the second queue unwatched too (an A/A run)")
    parser.add_argument("--watched-first", action="store_true", help="open the watched queue first")
    args = parser.parse_args()
    pairs, size = (10, 500) if args.quick else (args.pairs, args.batch)
    print(
        f"procq observability cost; {os.cpu_count()} CPUs, {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.platform()}; {pairs} pairs of {size:,}-job batches; "
        f"watched: read every {args.every:g} s of its run time{' (control: never read)' if args.control else ''}; "
        f"opened {'watched' if args.watched_first else 'off'} first; load before: {os.getloadavg()[0]:.2f}"
    )
    lanes = {"t": Lane(workers=2, capacity=size)}
    opened = []
    for side in ("watched", "off") if args.watched_first else ("off", "watched"):
        opened.append(ProcQueue(lanes, monitor=side == "watched", name=f"bench-{side}"))
    on, off = opened if args.watched_first else opened[::-1]
    with off, on:
        reader = Reader(on)
        try:
            for q in (off, on):
                for i in range(50):
                    q.push_and_wait(Job(f"warm-{i}", noop))
            times: dict[str, list[float]] = {"off": [], "watched": []}
            ran = next_read = 0.0  # the watched queue's running time so far, and when its next read is due
            for p in range(pairs):
                for side in ("off", "watched") if p % 2 == 0 else ("watched", "off"):
                    keys = [f"{p}-{i}" for i in range(size)]
                    if side == "watched":
                        while ran >= next_read and not args.control:  # (due by the watched queue's run time)
                            reader.ask()
                            next_read += args.every
                        took = batch(on, keys)
                        ran += took
                        reader.collect()
                    else:
                        took = batch(off, keys)
                    times[side].append(took)
        finally:
            reader.close()
    total = {side: pairs * size / sum(ts) for side, ts in times.items()}
    ratio = statistics.median(o / w for o, w in zip(times["off"], times["watched"], strict=True))
    print(
        f"tiny: off {total['off']:,.0f} jobs/s, watched {total['watched']:,.0f} jobs/s over all batches "
        f"(x{total['watched'] / total['off']:.3f}); median of the pairs' ratios: watched x{ratio:.3f} of off; "
        f"{reader.reads} reads in {ran:.1f} s of the watched queue's run time"
    )
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
