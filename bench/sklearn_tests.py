"""``python -m bench.sklearn_tests [--rounds N] [MODULE ...]``: scikit-learn's
own tests that use ``n_jobs``, run by pytest with joblib's default backend
set to procq, then to loky, interleaved over rounds; prints each run's wall
time and pytest's summary, then the medians and procq / loky.

What it measures is what a user of scikit-learn sees from a test run (or
any program run from pytest): no forkserver preload, estimators whose code
is imported lazily, many short ``Parallel`` calls. Each run is a fresh
``python -m pytest`` process (``-p bench.sklearn_plugin`` sets the backend
and keeps the tests whose code or parameters name ``n_jobs``), in an empty
temporary directory. The target: procq's median at most 1.1x loky's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: scikit-learn's test modules with the most ``n_jobs`` uses.
MODULES = (
    "sklearn.model_selection.tests.test_search",
    "sklearn.model_selection.tests.test_validation",
    "sklearn.utils.tests.test_parallel",
    "sklearn.inspection.tests.test_permutation_importance",
    "sklearn.feature_selection.tests.test_rfe",
    "sklearn.ensemble.tests.test_forest",
    "sklearn.metrics.tests.test_pairwise",
    "sklearn.neighbors.tests.test_neighbors",
)
BACKENDS = ("procq", "loky")


def run(backend: str, modules: list[str], cwd: str) -> tuple[float, str]:
    """One pytest run with ``backend``: its wall time, and pytest's last line."""
    env = dict(os.environ, PROCQ_BENCH_BACKEND=backend)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "bench.sklearn_plugin"]
    started = time.monotonic()
    proc = subprocess.run([*command, "--pyargs", *modules], capture_output=True, text=True, env=env, cwd=cwd)
    wall = time.monotonic() - started
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0:
        raise RuntimeError(f"{backend}: pytest exited with {proc.returncode}:\n" + "\n".join(lines[-30:]))
    return wall, lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sklearn_tests", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both backends (default 3)")
    parser.add_argument("modules", nargs="*", default=list(MODULES), help="scikit-learn test modules, dotted")
    args = parser.parse_args(argv)
    walls: dict[str, list[float]] = {b: [] for b in BACKENDS}
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs", flush=True)
    with tempfile.TemporaryDirectory() as cwd:
        for r in range(args.rounds):
            order = BACKENDS if r % 2 == 0 else BACKENDS[::-1]
            for backend in order:
                wall, summary = run(backend, args.modules, cwd)
                walls[backend].append(wall)
                print(f"round {r + 1}/{args.rounds} {backend:6} {wall:7.1f} s  {summary}", flush=True)
    procq, loky = statistics.median(walls["procq"]), statistics.median(walls["loky"])
    verdict = "met" if procq <= 1.1 * loky else "missed"
    ratio = procq / loky
    print(f"median wall: procq {procq:.1f} s, loky {loky:.1f} s; procq / loky {ratio:.2f} (target <= 1.10: {verdict})")
    print(f"load average (1 min) at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
