"""What the benchmark prints: the machine, the table of medians and ratios, the targets.

``TARGETS`` holds the performance targets procq is held to, each a function of the medians that
returns verdicts (met / missed / n/a, with the figure). Add a target by
appending a function.
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
from collections.abc import Callable

from bench.workloads import Config, Workload

#: medians[engine, workload, metric]
Medians = dict[tuple[str, str, str], float]
#: not_applicable[engine, workload] = why
NotApplicableRuns = dict[tuple[str, str], str]
#: (status, sentence): status is "met", "missed" or "n/a"
Verdict = tuple[str, str]


# --- the machine ----------------------------------------------------------------


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


def steal_since(before: tuple[int, int] | None) -> str:
    after = cpu_ticks()
    if before is None or after is None or after[1] <= before[1]:
        return "n/a"
    return f"{(after[0] - before[0]) / (after[1] - before[1]):.1%}"


def loadavg() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:  # pragma: no cover - not on this platform
        return "n/a"


# --- the table ------------------------------------------------------------------------


def table(
    workloads: list[Workload],
    engines: list[str],
    med: Medians,
    na: NotApplicableRuns,
    cfg: Config,
    runs: Callable[[str, str], bool] = lambda engine, workload: True,
) -> list[str]:
    """One markdown table: a row per metric, a column per engine. A peer's cell
    shows its median and, in brackets, procq / that peer. A cell of a
    workload the engine does not run (``runs(engine, workload)``) is empty."""
    head = "| workload | metric | better | " + " | ".join(engines) + " |"
    lines = [head, "|---|---|---|" + "---:|" * len(engines)]
    labels = cfg.labels()
    for w in workloads:
        for m in w.metrics:
            cells = []
            mine = med.get(("procq", w.name, m.key))
            shown_any = False
            for engine in engines:
                if (w.engines is not None and engine not in w.engines) or not runs(engine, w.name):
                    cells.append("")
                    continue
                if (engine, w.name) in na:
                    cells.append(f"n/a ({na[engine, w.name]})")
                    continue
                value = med.get((engine, w.name, m.key))
                if value is None:
                    cells.append("-")
                    continue
                shown_any = True
                cell = m.fmt(value)
                if engine != "procq" and m.better != "-" and m.ratio and mine is not None:
                    cell += f" [{ratio(mine, value)}]"
                cells.append(cell)
            if shown_any or any(c.startswith("n/a") for c in cells):
                lines.append(f"| {w.name} | {m.label.format(**labels)} | {m.better} | " + " | ".join(cells) + " |")
    return lines


def ratio(a: float, b: float) -> str:
    if math.isinf(a) and math.isinf(b):
        return "="
    if b == 0:
        return "-" if a == 0 else "inf"
    if math.isinf(b):
        return "0"
    if math.isinf(a):
        return "inf"
    return f"{a / b:.2f}"


# --- the targets -------------------------------------------------------------------------


def _tiny(med: Medians, cfg: Config) -> list[Verdict]:
    out: list[Verdict] = []
    p = med.get(("procq", "tiny", "jobs_per_s"))
    if p is None:
        return out
    peers = (("mp.Pool", 2.0, "2x multiprocessing.Pool"), ("raw pipe", 0.5, "half the raw pipe floor"))
    for peer, factor, name in peers:
        b = med.get((peer, "tiny", "jobs_per_s"))
        if b is not None:
            out.append(
                (
                    "met" if p >= factor * b else "missed",
                    f"tiny >= {name}: procq {p:,.0f} jobs/s vs {peer} {b:,.0f} (x{p / b:.2f}; need x{factor:g})",
                )
            )
    return out


def _latency(med: Medians, cfg: Config) -> list[Verdict]:
    out: list[Verdict] = []
    p50, p99 = med.get(("procq", "latency", "p50_us")), med.get(("procq", "latency", "p99_us"))
    # The floor is the bare pipe's round trip: the least code that makes one.
    floor = med.get(("bare pipe", "latency", "p50_us"))
    if p50 is not None and floor is not None:
        out.append(
            (
                "met" if p50 <= 3 * floor else "missed",
                (
                    f"latency p50 <= 3x the bare pipe floor: procq {p50:,.0f} us vs floor {floor:,.0f} us "
                    f"(x{p50 / floor:.2f}; need x3, i.e. <= {3 * floor:,.0f} us)"
                ),
            )
        )
    if p99 is not None:
        out.append(("met" if p99 < 1000 else "missed", f"latency p99 < 1 ms: procq {p99:,.0f} us"))
    floor99 = med.get(("raw pipe", "latency", "p99_us"))
    if p99 is not None and floor99 is not None:
        out.append(
            (
                "met" if p99 <= 5 * floor99 else "missed",
                f"latency p99 <= 5x the raw pipe floor's: procq {p99:,.0f} us vs floor {floor99:,.0f} us "
                f"(x{p99 / floor99:.2f})",
            )
        )
    return out


def _cpu(med: Medians, cfg: Config) -> list[Verdict]:
    e = med.get(("procq", "cpu", "efficiency"))
    return [] if e is None else [("met" if e >= 0.95 else "missed", f"cpu efficiency >= 0.95: procq {e:.3f}")]


def _bigdata(med: Medians, cfg: Config) -> list[Verdict]:
    p, f = med.get(("procq", "bigdata", "mb_per_s")), med.get(("raw pipe", "bigdata", "mb_per_s"))
    if p is None or f is None:
        return []
    return [
        (
            "met" if p >= 0.8 * f else "missed",
            f"bigdata >= 0.8x the raw pipe floor: procq {p:,.0f} MB/s vs floor {f:,.0f} MB/s (x{p / f:.2f})",
        )
    ]


#: The large arrays' targets (``bench.arrays``): the figure (procq's GB/s over
#: the engine's, in the same run), the workload, the engine, the least ratio, and what it says.
ARRAY_TARGETS = (
    ("in_floor", "in", "shm-floor", 0.5, "an array in, its sum out: >= 0.5x the shared-memory floor"),
    ("in_joblib", "in", "joblib", 2.0, "an array in, its sum out: >= 2x joblib/loky"),
    ("inout_floor", "in+out", "shm-floor", 0.4, "an array in, an array out: >= 0.4x the floor"),
    ("inout_joblib", "in+out", "joblib", 2.0, "an array in, an array out: >= 2x joblib/loky"),
    ("map_floor", "map", "shm-floor", 0.5, "a map of arrays: >= 0.5x the floor"),
)


def _arrays(med: Medians, cfg: Config) -> list[Verdict]:
    out: list[Verdict] = []
    for figure, _, _, least, what in ARRAY_TARGETS:
        got = med.get(("procq", "arrays", figure))
        if got is not None:
            out.append(("met" if got >= least else "missed", f"large arrays, {what}: x{got:.2f}"))
    return out


def _crash(med: Medians, cfg: Config) -> list[Verdict]:
    def get(metric: str) -> float | None:
        return med.get(("procq", "crash", metric))

    n = cfg.labels()
    out: list[Verdict] = []
    good, sig, usable = get("good_ok"), get("crash_signal"), get("usable_after")
    recover, notify, batch = get("recover_ms"), get("notify_ms"), get("batch_ms")
    if good is not None:
        out.append(("met" if good == n["good"] else "missed", f"crash: good jobs correct {good:.0f}/{n['good']}"))
    if sig is not None:
        out.append(
            ("met" if sig == n["crashes"] else "missed", f"crash: reported with their signal {sig:.0f}/{n['crashes']}")
        )
    if usable is not None:
        out.append(("met" if usable == 1 else "missed", f"crash: queue usable after: {'yes' if usable else 'no'}"))
    if recover is not None:
        out.append(
            (
                "met" if recover <= 100 else "missed",
                f"crash: last answer within 100 ms of the last crash: {recover:,.0f} ms",
            )
        )
    if batch is not None:
        out.append(
            ("met" if batch < 100 else "missed", f"crash batch: first push to last answer < 100 ms: {batch:,.0f} ms")
        )
    if notify is not None:
        out.append(
            (
                "met" if notify <= 5 else "missed",
                f"crash: waiter notified within 5 ms median of the death: {notify:.2f} ms",
            )
        )
    return out


def _starts(med: Medians, cfg: Config) -> list[Verdict]:
    """Worker starts: the crash batch with its job in a main script, and a fresh engine's first job."""
    out: list[Verdict] = []
    batch = med.get(("procq", "crash_main", "batch_ms"))
    if batch is not None:
        out.append(
            (
                "met" if batch < 100 else "missed",
                f"crash batch, job in a 1,900-line main script: first push to last answer < 100 ms: {batch:,.0f} ms",
            )
        )
    start = med.get(("procq", "start", "start_ms"))
    if start is not None:
        out.append(("met" if start <= 5 else "missed", f"worker start (push -> job running) <= 5 ms: {start:,.2f} ms"))
    return out


def _heavy(med: Medians, cfg: Config) -> list[Verdict]:
    """The crash batch with a heavy job module imported lazily: learned warm starts."""
    lazy, top = med.get(("procq", "crash_heavy", "batch_ms")), med.get(("procq", "crash_heavy_top", "batch_ms"))
    out: list[Verdict] = []
    if lazy is not None:
        out.append(
            (
                "met" if lazy < 150 else "missed",
                f"crash batch, heavy job module imported under the main guard: < 150 ms: {lazy:,.0f} ms"
                + ("" if top is None else f" (imported at the script's top: {top:,.0f} ms)"),
            )
        )
    return out


def _startup_close(med: Medians, cfg: Config) -> list[Verdict]:
    out: list[Verdict] = []
    p, b = med.get(("procq", "startup", "startup_ms")), med.get(("PPE", "startup", "startup_ms"))
    if p is not None and b is not None:
        out.append(
            (
                "met" if p <= b else "missed",
                f"start-up (create + first job) <= PPE: procq {p:,.0f} ms vs PPE {b:,.0f} ms",
            )
        )
    c = med.get(("procq", "close", "close_ms"))
    if c is not None:
        out.append(("met" if c < 50 else "missed", f"close() of idle workers < 50 ms: procq {c:,.1f} ms"))
    return out


def _cached(med: Medians, cfg: Config) -> list[Verdict]:
    one, many = med.get(("procq", "cached", "single_per_s")), med.get(("procq", "cached", "threads_per_s"))
    out: list[Verdict] = []
    if one is not None:
        out.append(("met" if one >= 500_000 else "missed", f"cached push >= 500,000/s from 1 thread: {one:,.0f}/s"))
    if one is not None and many is not None:
        t = cfg.cached_threads
        out.append(
            (
                "met" if many >= 0.5 * one else "missed",
                (
                    f"cached push, {t} threads do not collapse (>= half of 1 thread): {many:,.0f}/s together, "
                    f"x{many / one:.2f} of 1 thread"
                ),
            )
        )
    return out


def _map(med: Medians, cfg: Config, na: NotApplicableRuns) -> list[Verdict]:
    if ("procq", "map") in na:
        return [("n/a", f"map: {na['procq', 'map']}")]
    p, b = med.get(("procq", "map", "items_per_s")), med.get(("mp.Pool", "map", "items_per_s"))
    out: list[Verdict] = []
    if p is not None and b is not None:
        chunk = med.get(("mp.Pool", "map", "chunksize"), 0)
        out.append(
            (
                "met" if p > b else "missed",
                f"map beats Pool.imap at its best chunksize ({chunk:,.0f}): procq {p:,.0f} items/s vs {b:,.0f}",
            )
        )
    growth, peak = med.get(("procq", "map", "rss_growth_mb")), med.get(("procq", "map", "peak_rss_mb"))
    if growth is not None and peak is not None:
        # 64 MB for a million items is under 64 bytes an item: less than keeping every item would take.
        out.append(
            (
                "met" if growth <= 64 else "missed",
                f"map in bounded supervisor memory (growth <= 64 MB): peak RSS {peak:,.0f} MB, grew {growth:,.1f} MB",
            )
        )
    return out


TARGETS: list[Callable[..., list[Verdict]]] = [
    _tiny,
    _latency,
    _cpu,
    _bigdata,
    _arrays,
    _crash,
    _starts,
    _heavy,
    _startup_close,
    _cached,
]


def verdicts(med: Medians, na: NotApplicableRuns, cfg: Config, ran: set[str]) -> list[Verdict]:
    out: list[Verdict] = []
    for target in TARGETS:
        out.extend(target(med, cfg))
    if "map" in ran:
        out.extend(_map(med, cfg, na))
    return out
