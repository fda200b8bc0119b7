"""``python -m bench.tiny_ceiling [--rounds N]``: tiny against 2x ``mp.Pool``, the collector on and off.

Runs the benchmark's tiny workload (``bench.workloads.run_tiny``: 20,000
no-op jobs pushed one by one, then awaited) round by round, alternating three
runs in each round: ``mp.Pool``, procq as the benchmark runs it, and procq
with Python's cyclic garbage collector off for the timed part (a ceiling: no
program can count on that). Prints each round's jobs/s and procq's ratios to
``mp.Pool`` in that round, then the medians.

What it answers: whether a miss of "tiny >= 2x mp.Pool" is procq's own work
per job or the collector's share of it, measured beside the peer each time,
on whatever the machine is doing at that moment.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile

from bench.engines import BY_NAME, ensure_forkserver
from bench.workloads import Config, run_tiny


def _procq_without_collector(cfg: Config, tmp: str) -> float:
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        return run_tiny(BY_NAME["procq"], cfg, tmp)["jobs_per_s"]
    finally:
        if enabled:
            gc.enable()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    ensure_forkserver()
    cfg = Config()
    rows: list[tuple[float, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        print("round  mp.Pool   procq  (ratio)   procq, collector off  (ratio)")
        for i in range(args.rounds):
            pool = run_tiny(BY_NAME["mp.Pool"], cfg, tmp)["jobs_per_s"]
            procq = run_tiny(BY_NAME["procq"], cfg, tmp)["jobs_per_s"]
            off = _procq_without_collector(cfg, tmp)
            rows.append((pool, procq, off))
            print(f"{i + 1:>5} {pool:>8,.0f} {procq:>7,.0f}  ({procq / pool:.2f})   {off:>20,.0f}  ({off / pool:.2f})")
    pool, procq, off = (statistics.median(col) for col in zip(*rows, strict=True))
    met = sum(p / b >= 2 for b, p, _ in rows)
    met_off = sum(o / b >= 2 for b, _, o in rows)
    print(
        f"medians: mp.Pool {pool:,.0f}, procq {procq:,.0f} (x{procq / pool:.2f}; >= 2x in {met}/{len(rows)} rounds), "
        f"collector off {off:,.0f} (x{off / pool:.2f}; >= 2x in {met_off}/{len(rows)} rounds)"
    )


if __name__ == "__main__":
    main()
