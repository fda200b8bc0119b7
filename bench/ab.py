"""Compare procq at two commits on the same machine in one run: ``python -m bench.ab BEFORE_DIR AFTER_DIR``.

Each directory is a checkout of procq (``git worktree add DIR COMMIT``). The
workloads run there (``python -m bench --only ... --engines "raw pipe"``) in
alternating order, ``--rounds`` times each, so that the host's drift hits both
alike; each figure is reported as the median of its rounds, and beside it as a
ratio to the raw pipe floor measured in the same invocation (the ratio is what
drift moves least)."""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys

FIGURES = {
    ("tiny", "jobs_per_s"): "tiny, jobs/s (higher)",
    ("latency", "p50_us"): "latency p50, us (lower)",
    ("latency", "p99_us"): "latency p99, us (lower)",
    ("bigdata", "mb_per_s"): "bigdata, MB/s (higher)",
    ("crash", "recover_ms"): "crash: last crash -> last answer, ms (lower)",
    ("crash", "notify_ms"): "crash: kill -> waiter told, ms (lower)",
    ("crash", "batch_ms"): "crash: first push -> last answer, ms (lower)",
    ("crash_main", "batch_ms"): "crash, job in the main script: first push -> last answer, ms (lower)",
    ("start", "start_ms"): "worker start: submit -> job running, ms (lower)",
    ("cpu", "efficiency"): "cpu: efficiency (higher)",
    ("startup", "startup_ms"): "start-up: create + first job, ms (lower)",
    ("close", "close_ms"): "close(), ms (lower)",
    ("cached", "single_per_s"): "cached pushes/s, 1 thread (higher)",
    ("cached", "threads_per_s"): "cached pushes/s, 8 threads (higher)",
    ("map", "items_per_s"): "map, items/s (higher)",
}
WORKLOADS = sorted({workload for workload, _ in FIGURES})
_LINE = re.compile(r"round \d+/\d+\s+(\w+)\s+(procq|raw pipe)\s+(.*?)\s+\(")


def _run(directory: str, workloads: list[str]) -> dict[tuple[str, str, str], float]:
    cmd = [sys.executable, "-m", "bench", "--only", *workloads, "--engines", "raw pipe", "--rounds", "1"]
    out = subprocess.run(cmd, cwd=directory, capture_output=True, text=True, check=True, timeout=900).stdout
    figures = {}
    for workload, engine, fields in _LINE.findall(out):
        for item in fields.split(", "):
            name, value = item.split("=")
            figures[(workload, engine, name)] = float(value.replace(",", ""))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", nargs="+", default=["tiny", "latency", "bigdata", "crash"], choices=WORKLOADS)
    args = parser.parse_args()
    runs: dict[str, list[dict[tuple[str, str, str], float]]] = {"before": [], "after": []}
    for r in range(args.rounds):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for side in order:
            runs[side].append(_run(getattr(args, side), args.only))
            print(f"round {r + 1}/{args.rounds}: {side} done", file=sys.stderr, flush=True)
    print("| figure | before | after | after/before | before / floor | after / floor |")
    print("|---|---:|---:|---:|---:|---:|")
    for (workload, name), label in FIGURES.items():
        if workload not in args.only:
            continue
        row = [label]
        med, ratio = {}, {}
        if any((workload, "procq", name) not in run for side in runs.values() for run in side):
            continue  # a figure one of the two commits' bench does not measure
        for side in ("before", "after"):
            values = [run[(workload, "procq", name)] for run in runs[side]]
            # (cached and map have no raw pipe floor: their ratios are left blank)
            floors = [run.get((workload, "raw pipe", name), 0.0) for run in runs[side]]
            med[side] = statistics.median(values)
            pairs = [v / f for v, f in zip(values, floors, strict=True) if f]
            ratio[side] = f"{statistics.median(pairs):.2f}" if pairs else ""
        row += [f"{med['before']:,.1f}", f"{med['after']:,.1f}", f"{med['after'] / med['before']:.2f}"]
        row += [ratio["before"], ratio["after"]]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
