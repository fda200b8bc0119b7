"""``python -m bench [--quick] [--rounds N] [--only WORKLOAD ...] [--engines NAME ...]``

Runs every workload for procq and each peer, interleaved over rounds: in each
round every workload runs once per engine, and the engine that goes first
rotates from round to round, so drift on a shared machine falls on all alike.
Prints one table of medians (a peer's cell also shows procq / that peer) and
the performance targets (``report.TARGETS``), met or missed, with the figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
import traceback

from bench import report
from bench.engines import BY_NAME, PEERS, START_METHOD, ensure_forkserver
from bench.workloads import QUICK, Config, NotApplicable, calibrate
from bench.workloads_starts import every_workload


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    workloads_by_name = every_workload()
    parser = argparse.ArgumentParser(prog="python -m bench", description=doc.strip().splitlines()[-1])
    parser.add_argument("--rounds", type=int, default=None, help="rounds of every workload (default 3; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="a short smoke run: fewer jobs, one round")
    parser.add_argument(
        "--only", nargs="+", choices=list(workloads_by_name), metavar="WORKLOAD", help="run only these workloads"
    )
    parser.add_argument(
        "--engines",
        nargs="+",
        choices=list(BY_NAME),
        metavar="ENGINE",
        help="run only these engines (procq always runs)",
    )
    parser.add_argument(
        "--no-preload-jobs",
        dest="preload_jobs",
        action="store_false",
        help="do not have the forkserver import bench.jobs: every new worker of every engine imports it itself",
    )
    args = parser.parse_args(argv)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    if rounds < 1:
        parser.error("--rounds must be at least 1")
    workloads = [w for w in workloads_by_name.values() if not args.only or w.name in args.only]

    cfg = Config(**QUICK) if args.quick else Config()
    cfg = dataclasses.replace(cfg, spin_n=calibrate(cfg.cpu_job_seconds))

    info = report.machine()
    print("procq benchmark: procq vs its peers, 2 workers each")
    print(f"machine: {info['nproc']} CPUs, {info['cpu']}; {info['python']}; {info['os']}")
    print(f"procq at commit {report.revision()}; load average (1 min) at start: {report.loadavg()}")
    peers = []
    for peer in PEERS:
        if args.engines and peer.name != "procq" and peer.name not in args.engines:
            continue
        why = peer.missing()
        if why is not None:
            if peer.name == "procq":  # never silently: the bench exists to measure procq
                raise SystemExit(f"procq cannot run: {why}")
            print(f"skipped {peer.name}: {why}")
            continue
        peers.append(peer)
        print(f"  {peer.name:<9} {peer.how}")
    print(
        f"settings: start method {START_METHOD} where the engine allows it, {rounds} round(s)"
        f"{' (quick)' if args.quick else ''}; tiny {cfg.tiny_jobs:,} jobs; latency {cfg.latency_samples:,} samples"
        f" after {cfg.latency_warmup}; cpu {cfg.cpu_jobs} x ~{cfg.cpu_job_seconds * 1e3:.0f} ms"
        f" (spin n={cfg.spin_n:,});"
        f" bigdata {cfg.big_jobs} x {cfg.big_bytes / 1e6:g} MB;"
        f" arrays {cfg.array_mib} MiB, map {cfg.array_map_items} x {cfg.array_map_mib} MiB;"
        f" crash {cfg.crash_jobs} jobs, every {cfg.crash_every}th"
        f" killed, {cfg.crash_probes} timed kill(s), {cfg.crash_timeout:g} s bound;"
        f" cached {cfg.cached_pushes:,} pushes;"
        f" map {cfg.map_items:,} items, imap chunksizes {', '.join(map(str, cfg.map_chunksizes))};"
        f" warm-up {cfg.warmup_jobs} jobs;"
        f" job module {'preloaded by' if args.preload_jobs else 'imported by each worker, not'} the forkserver"
    )
    print()
    ensure_forkserver(args.preload_jobs)

    results: dict[tuple[str, str, str], list[float]] = {}
    na: report.NotApplicableRuns = {}
    ticks = report.cpu_ticks()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="procq-bench-") as tmp:
        for r in range(rounds):
            for w in workloads:
                mine = [p for p in peers if p.runs(w.name) and (w.engines is None or p.name in w.engines)]
                shift = r % len(mine)
                for peer in mine[shift:] + mine[:shift]:
                    t0 = time.perf_counter()
                    try:
                        figures = w.run(peer, cfg, tmp)
                    except NotApplicable as exc:
                        na[peer.name, w.name] = str(exc)
                        print(f"round {r + 1}/{rounds}  {w.name:<8} {peer.name:<9} n/a: {exc}", flush=True)
                        continue
                    except Exception as exc:
                        if peer.name == "procq":
                            raise
                        traceback.print_exc()
                        na[peer.name, w.name] = f"failed: {type(exc).__name__}"
                        print(f"round {r + 1}/{rounds}  {w.name:<8} {peer.name:<9} FAILED: {exc!r}", flush=True)
                        continue
                    took = time.perf_counter() - t0
                    for metric, value in figures.items():
                        results.setdefault((peer.name, w.name, metric), []).append(value)
                    shown = ", ".join(f"{k}={v:,.3f}" for k, v in figures.items())
                    print(f"round {r + 1}/{rounds}  {w.name:<8} {peer.name:<9} {shown}  ({took:.1f}s)", flush=True)
    total = time.perf_counter() - started

    med = {k: statistics.median(v) for k, v in results.items()}
    print()
    print(f"Medians over {rounds} round(s). [x] after a peer's figure: procq / that peer.")
    print()
    runs = {p.name: p for p in peers}
    for line in report.table(workloads, list(runs), med, na, cfg, lambda engine, w: runs[engine].runs(w)):
        print(line)
    print()
    print("Targets:")
    for status, sentence in report.verdicts(med, na, cfg, {w.name for w in workloads}):
        print(f"  [{status.upper()}] {sentence}")
    print()
    print(
        f"total benchmark time: {total:.1f}s; load average (1 min) at end: {report.loadavg()};"
        f" CPU steal during the run: {report.steal_since(ticks)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
