"""The benchmark runs end to end (``python -m bench --quick``), with nothing
beyond the standard library's peers, and reports procq in every workload it ran.

No timing is asserted: only that each workload produced figures, and the
crash workload's counts, which do not depend on speed."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys

from bench.engines import Peer, ProcqEngine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python_m(*args: str) -> str:
    """The output of ``python -m ARGS`` run from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=50, check=True
    ).stdout


def test_quick_run_reports_procq_and_the_floor() -> None:
    out = _python_m("bench", "--quick", "--only", "tiny", "latency", "crash", "map", "--engines", "raw pipe")
    assert "| workload | metric | better | procq | raw pipe |" in out, out
    # Each row shows a figure for procq and one for the floor, with procq / floor beside it.
    assert re.search(
        r"^\| tiny \| throughput, jobs/s \| higher \| [\d,]+ \| [\d,]+ \[\d+\.\d\d\] \|$", out, re.MULTILINE
    ), out
    assert re.search(r"^\| latency \| p50, us \| lower \| [\d,]+ \| [\d,]+ \[\d+\.\d\d\] \|$", out, re.MULTILINE), out
    # Crash isolation is counted, not timed: every good job right, every crash named with its signal.
    assert re.search(r"^\| crash \| good jobs correct \(of 36\) \| higher \| 36 \| 36 \|$", out, re.MULTILINE), out
    assert "[MET] crash: reported with their signal 4/4" in out, out
    assert "[MET] crash: queue usable after: yes" in out, out
    from procq import ProcQueue

    if hasattr(ProcQueue, "map"):
        assert re.search(r"^\| map \| items/s \| higher \| [\d,]+ \|", out, re.MULTILINE), out
    else:
        assert "[N/A] map: procq has no map yet" in out, out


def test_a_peer_that_is_not_installed_says_why() -> None:
    missing = Peer("nope", ProcqEngine, "no_such_module_procq_bench", "-")
    assert missing.missing() == "no_such_module_procq_bench is not installed (pip install -e '.[bench]')"
    assert Peer("procq", ProcqEngine, None, "-").missing() is None


def test_worker_start_costs_are_reported() -> None:
    number = r"\d+\.\d\d"
    out = _python_m("bench.starts", "forkserver", "-n", "3", "--preload", "json")
    assert re.fullmatch(
        rf"forkserver preloading json: RSS \d+ MB; per start: wall {number} ms, server and children CPU {number} ms,"
        rf" this process {number} ms\n",
        out,
    ), out
    out = _python_m("bench.starts", "crashes", "-n", "2")  # each crash's failure kind is checked in the run itself
    assert re.fullmatch(
        rf"2 crashes in a row on one worker: per crash, wall {number} ms, supervisor and caller CPU {number} ms,"
        rf" forkserver and workers CPU {number} ms\n",
        out,
    ), out


def test_the_sandbox_bench_runs() -> None:
    out = _python_m("bench.sandbox", "--quick")
    row = r"^\| round trip, median ms per job \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [+-][\d.]+ \| [+-][\d.]+ \|$"
    assert re.search(row, out, re.MULTILINE), out  # untrusted, unbounded sandbox, sandbox; the two differences
    assert re.search(r"^\| sandbox: seccomp filter \(per job\) \| [\d.]+ \|$", out, re.MULTILINE), out


def test_programs_sharing_a_store_report_their_waits() -> None:
    out = _python_m("bench.store", "--only-programs", "--programs", "2", "--seconds", "1")
    assert re.search(
        r"^2 programs on one SQLite file, 1 s: [\d,]+ jobs \([\d,]+, [\d,]+\); "
        r"wait for an outcome: worst \d+\.\d{3} s, p99 \d+ ms; job's end to its handle done: worst -?\d+ ms, "
        r"p99 -?\d+ ms$",
        out,
        re.MULTILINE,
    ), out
    assert "| 2 programs on one SQLite file, 1 s: worst wait (p99), jobs |" in out, out


def test_the_cost_of_watching_a_queue_is_reported() -> None:
    out = _python_m("bench.observe", "--quick", "--every", "0.01")
    figures = r"^tiny: off [\d,]+ jobs/s, watched [\d,]+ jobs/s .* watched x\d+\.\d{3} of off; [1-9]\d* reads"
    assert re.search(figures, out, re.MULTILINE), out


def test_worker_start_workloads_and_the_bare_floor_run() -> None:
    """The crash batch run by a main script that defines its job, a fresh
    engine's first job, and the latency floor that runs nothing but latency."""
    out = _python_m("bench", "--quick", "--only", "latency", "crash_main", "start", "--engines", "bare pipe")
    assert "| workload | metric | better | procq | bare pipe |" in out, out
    assert re.search(r"^\| latency \| p50, us \| lower \| [\d,]+ \| [\d,]+ \[\d+\.\d\d\] \|$", out, re.MULTILINE), out
    assert re.search(r"^\| crash_main \| good jobs correct \(of 36\) \| higher \| 36 \|  \|$", out, re.MULTILINE), out
    assert re.search(r"^\| crash_main \| crashed jobs never resolved \(of 4\) \| lower \| 0 \|  \|$", out, re.MULTILINE)
    assert re.search(r"^\| start \| submit -> job running, median ms \| lower \| [\d.,]+ \|  \|$", out, re.MULTILINE)
    assert "latency p50 <= 3x the bare pipe floor" in out, out
    assert "crash batch, job in a 1,900-line main script" in out, out


def test_the_crash_main_script_is_a_realistic_main_script() -> None:
    # A short file in the repository; loaded, a script of 1,900 lines of its
    # own code, every function defined in the main module as a worker runs it.
    script = os.path.join(ROOT, "bench", "crash_main.py")
    with open(script) as f:
        lines = f.read().splitlines()
    assert len(lines) < 200
    assert sum(line.startswith("import ") for line in lines) >= 5
    loaded = runpy.run_path(script, run_name="__mp_main__")
    assert len(lines) + len(loaded["rules_source"]().splitlines()) >= 1900
    rules = [fn for name, fn in loaded.items() if name.startswith("price_") and name != "price_line"]
    assert len(rules) == len(loaded["PRICERS"]) == 160
    assert all(fn.__module__ == "__mp_main__" and fn.__code__.co_filename.startswith(script) for fn in rules)


def test_the_heavy_module_crash_batches_run() -> None:
    """The crash batch whose job module imports numpy and scipy, imported
    lazily and at the script's top, each a program of its own."""
    out = _python_m("bench", "--quick", "--only", "crash_heavy", "crash_heavy_top", "--engines", "bare pipe")
    for name in ("crash_heavy", "crash_heavy_top"):
        assert re.search(rf"^\| {name} \| good jobs correct \(of 36\) \| higher \| 36 \|  \|$", out, re.MULTILINE), out
        assert re.search(
            rf"^\| {name} \| crashed jobs never resolved \(of 4\) \| lower \| 0 \|  \|$", out, re.MULTILINE
        )
    assert "crash batch, heavy job module imported under the main guard: < 150 ms" in out, out
