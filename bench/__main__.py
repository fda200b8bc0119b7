"""``python -m bench [--rounds N] [--quick] [--only NAME ...]``: procq vs ProcessPoolExecutor.

Each round runs every workload once for each engine, alternating which engine
goes first from one round to the next, so that drift on a shared machine falls
on both alike. The table shows the median over rounds of each per-round
figure, and procq/PPE.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from bench.workloads import QUICK, START_METHOD, WORKLOADS, Config, calibrate

# (workload, metric, label, which way is better, format)
ROWS = [
    ("tiny", "jobs_per_s", "throughput, jobs/s", "higher", "{:,.0f}"),
    ("latency", "p50_us", "round trip p50, us", "lower", "{:,.0f}"),
    ("latency", "p99_us", "round trip p99, us", "lower", "{:,.0f}"),
    ("cpu", "efficiency", "efficiency (ideal/actual wall)", "higher", "{:.3f}"),
    ("cpu", "wall_s", "wall for all jobs, s", "lower", "{:.3f}"),
    ("cpu", "job_ms", "one job in its worker, ms", "-", "{:.1f}"),
    ("crash", "notify_ms", "SIGKILL -> waiter notified, ms", "lower", "{:.2f}"),
    ("crash", "pool_broken", "share of crashes that broke the pool", "lower", "{:.0%}"),
]


def machine() -> dict[str, str]:
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "nproc": str(os.cpu_count()),
        "cpu": model,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "os": f"{platform.system()} {platform.release()} ({platform.platform(terse=True)})",
    }


def revision() -> str:
    """The commit procq was measured at, and whether procq/ had local changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "procq"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return f"{head}{' with local changes under procq/' if dirty else ''}"


def cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) jiffies from /proc/stat: time the hypervisor gave to others."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    steal = fields[7] if len(fields) > 7 else 0
    return steal, sum(fields[:8])


def loadavg() -> str:
    """The 1-minute load average: other work on the machine disturbs the figures."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:  # pragma: no cover - not on this platform
        return "n/a"


def targets(med: dict[tuple[str, str, str], float]) -> list[tuple[bool, str]]:
    """(met?, sentence) for each target whose figures were measured."""
    out: list[tuple[bool, str]] = []

    def have(*keys: tuple[str, str, str]) -> bool:
        return all(k in med for k in keys)

    p, e = ("procq", "PPE")
    if have((p, "tiny", "jobs_per_s"), (e, "tiny", "jobs_per_s")):
        a, b = med[p, "tiny", "jobs_per_s"], med[e, "tiny", "jobs_per_s"]
        out.append((a >= b, f"tiny throughput >= PPE: procq {a:,.0f} jobs/s vs PPE {b:,.0f} jobs/s (x{a / b:.2f})"))
    if have((p, "latency", "p50_us"), (e, "latency", "p50_us")):
        a, b = med[p, "latency", "p50_us"], med[e, "latency", "p50_us"]
        out.append((a <= b, f"latency p50 no worse than PPE: procq {a:,.0f} us vs PPE {b:,.0f} us (x{a / b:.2f})"))
    if have((p, "cpu", "efficiency")):
        a = med[p, "cpu", "efficiency"]
        out.append((a >= 0.95, f"CPU efficiency >= 0.95: procq {a:.3f}"))
    if have((p, "crash", "notify_ms")):
        a = med[p, "crash", "notify_ms"]
        out.append((a <= 10.0, f"crash notification <= 10 ms median: procq {a:.2f} ms"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="rounds of every workload (default 3; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="a short smoke run: fewer jobs, one round")
    parser.add_argument("--only", nargs="+", choices=list(WORKLOADS), help="run only these workloads")
    args = parser.parse_args(argv)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    if rounds < 1:
        parser.error("--rounds must be at least 1")
    names = [n for n in WORKLOADS if not args.only or n in args.only]

    cfg = Config(**QUICK) if args.quick else Config()
    cfg = dataclasses.replace(cfg, spin_n=calibrate(cfg.cpu_job_seconds))

    info = machine()
    print("procq benchmark: procq vs concurrent.futures.ProcessPoolExecutor (PPE)")
    print(f"machine: {info['nproc']} CPUs, {info['cpu']}; {info['python']}; {info['os']}")
    print(
        f"settings: {cfg.workers} workers each, start method {START_METHOD}, {rounds} round(s)"
        f"{' (quick)' if args.quick else ''}; tiny {cfg.tiny_jobs:,} jobs; latency {cfg.latency_samples:,} samples"
        f" after {cfg.latency_warmup} warm-up; cpu {cfg.cpu_jobs} jobs x ~{cfg.cpu_job_seconds * 1e3:.0f} ms"
        f" (spin n={cfg.spin_n:,}); crash {cfg.crashes} kills"
    )
    print(f"procq at commit {revision()}; load average (1 min) at start: {loadavg()}")
    print()

    # results[engine, workload, metric] = one value per round
    results: dict[tuple[str, str, str], list[float]] = {}
    ticks = cpu_ticks()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="procq-bench-") as tmp:
        for r in range(rounds):
            for name in names:
                procq_run, ppe_run = WORKLOADS[name]
                order = [("procq", procq_run), ("PPE", ppe_run)]
                if r % 2:
                    order.reverse()
                for engine, run in order:
                    t0 = time.perf_counter()
                    figures = run(cfg, tmp)
                    took = time.perf_counter() - t0
                    for metric, value in figures.items():
                        results.setdefault((engine, name, metric), []).append(value)
                    shown = ", ".join(f"{k}={v:,.3f}" for k, v in figures.items())
                    print(f"round {r + 1}/{rounds}  {name:<8} {engine:<6} {shown}  ({took:.1f}s)", flush=True)
    total = time.perf_counter() - started

    med = {k: statistics.median(v) for k, v in results.items()}
    print()
    print(f"Medians over {rounds} round(s); procq/PPE is the ratio of the two medians.")
    print()
    print("| workload | metric | better | procq | PPE | procq/PPE |")
    print("|---|---|---|---:|---:|---:|")
    for name, metric, label, better, fmt in ROWS:
        if name not in names:
            continue
        a, b = med.get(("procq", name, metric)), med.get(("PPE", name, metric))
        if a is None or b is None:
            continue
        ratio = f"{a / b:.2f}" if b else "-"
        shown_b = fmt.format(b)
        if metric == "notify_ms":
            shown_b += " (pool broken)"
        print(f"| {name} | {label} | {better} | {fmt.format(a)} | {shown_b} | {ratio} |")
    print()
    print("Per round (in run order):")
    for name, metric, label, _, fmt in ROWS:
        if name not in names:
            continue
        for engine in ("procq", "PPE"):
            values = results.get((engine, name, metric))
            if values:
                print(f"  {name:<8} {metric:<11} {engine:<6} " + "  ".join(fmt.format(v) for v in values))
    print()
    print("Targets:")
    for met, sentence in targets(med):
        print(f"  [{'MET' if met else 'MISSED'}] {sentence}")
    print()
    steal = ""
    after = cpu_ticks()
    if ticks is not None and after is not None and after[1] > ticks[1]:
        steal = f"; CPU steal during the run: {(after[0] - ticks[0]) / (after[1] - ticks[1]):.1%}"
    print(f"total benchmark time: {total:.1f}s; load average (1 min) at end: {loadavg()}{steal}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
