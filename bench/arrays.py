"""Large arrays: procq against its peers, a hand-written shared-memory floor
and the memcpy limit, on one machine in one run.

    python -m bench.arrays                 # 256 MiB arrays, 200 x 16 MiB map, 5 rounds
    python -m bench.arrays --quick         # 64 MiB, 40 x 4 MiB, 1 round

Every engine runs 2 worker processes, started before timing (a small job
warms each, then an untimed large job of each kind on each worker, and a
map of 8 of the map's arrays), and runs
one job at a time (the map: 2 at a time), each timed job right after an
untimed one of its engine, so a figure is what one large job costs, in a run
of many, from the caller's call to its result in hand:

- ``in``: a float64 array in, its sum out (GB/s of the array);
- ``in+out``: the array in, ``array + 1`` out (GB/s of the array);
- ``map``: many arrays, their sums out, all in flight through 2 workers
  (GB/s of all the arrays): ``q.map`` without ``key=`` (so its default
  keys, a digest of each array, are counted), and as ``procq key=`` with a
  key per item (what a map whose items have names of their own passes: no
  digest), joblib's ``Parallel``, the floor's two children.

Engines: ``procq`` (``push_and_wait``, ``map``); ``joblib`` (a ``Parallel``
per call over loky's reusable workers, which memory-maps arrays over 1 MB
into its workers: its ``max_nbytes`` default);
``ppe`` (``ProcessPoolExecutor``, forkserver: pickles through a pipe);
``ray`` (``ray.put`` and zero-copy reads; only if it is installed);
``shm-floor``: by hand, the least any engine must do: one
``multiprocessing.shared_memory`` segment per child, made once and reused,
the array copied into it, its name sent down a pipe to the child, which maps
it once (the result, for ``in+out``, the same way back: the child runs the
job, ``array + 1``, and copies what it returns into a segment of its own,
made once, which the parent maps once; the array handed back is overwritten
by the next job, which no real engine may do);
``shm-floor out=``: the same, the child adding into its segment
(``np.add(array, 1, out=...)``) with no array of its own: less than the job,
since no engine can make a job's function write into its buffer, shown
beside the floor (the new 256 MiB each job's ``array + 1`` allocates costs
35 ms on a quiet host, and up to a second when the kernel must compact
memory to back it with huge pages);
``memcpy``: one copy of the array into a buffer already touched, in this
process: the machine's limit.

Every job gets fresh data: a new array object (a view, so no copy is timed)
with one value changed, so that no engine can answer from a cache of what it
was sent before (joblib, within one ``Parallel``, dumps an array object to a
file once: the same object sent again, even changed since, is not dumped
again).

Rounds interleave the engines (the first rotates), and the medians print, with
procq's ratio to each. The targets of the shared-memory work are checked last.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from bench import report
from bench.workloads import Config, Metric, Workload, num

MIB = 1 << 20


# --- the jobs (module-level: every engine's workers import them) ----------------


def total(array: Any) -> float:
    return float(array.sum())


def plus_one(array: Any) -> Any:
    return array + 1


def set_threshold(n: int) -> None:
    """(In a worker) where its results' buffers start to go out of band."""
    import procq._wire.oob

    procq._wire.oob.OOB_BYTES = n


def _floor_child(conn: Connection) -> None:
    """The floor's child: maps each segment it is sent (once: the parent
    sends the same one again), answers the sum, or the job's ``array + 1``
    copied into a segment of its own, made once and written again each time
    (``into``: computed into that segment, with no array of its own)."""
    mapped: dict[str, shared_memory.SharedMemory] = {}
    out: shared_memory.SharedMemory | None = None
    while True:
        try:
            name, shape, want = conn.recv()
        except EOFError:
            return
        if name not in mapped:
            mapped[name] = shared_memory.SharedMemory(name=name)
        array = np.ndarray(shape, dtype=np.float64, buffer=mapped[name].buf)
        if want == "sum":
            conn.send(float(array.sum()))
        else:
            if out is None or out.size < array.nbytes:
                out = _untracked(shared_memory.SharedMemory(create=True, size=array.nbytes))
            view = np.ndarray(shape, dtype=np.float64, buffer=out.buf)
            if want == "into":
                np.add(array, 1, out=view)
            else:
                np.copyto(view, plus_one(array))
            del view
            conn.send(out.name)
        del array


def _untracked(seg: shared_memory.SharedMemory) -> shared_memory.SharedMemory:
    """``seg``, out of the resource tracker's hands: it would remove the
    segment as the process that made it exits, though another owns it now."""
    from multiprocessing import resource_tracker

    resource_tracker.unregister(seg._name, "shared_memory")  # type: ignore[attr-defined]
    return seg


# --- the engines ------------------------------------------------------------------


class Engine:
    name = ""
    workloads: tuple[str, ...] = ("in", "in+out", "map")

    def one(self, array: Any, want: str) -> Any:
        raise NotImplementedError

    def warm(self, array: Any, want: str) -> None:
        """One untimed job of ``want`` on each of the two workers, at once."""
        raise NotImplementedError

    def many(self, arrays: list[Any]) -> list[float]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Procq(Engine):
    name = "procq"

    def __init__(self) -> None:
        from procq import Job, ProcQueue

        self.Job = Job
        self.q = ProcQueue(2)
        self.n = 0
        for i in range(2):
            self.q.push_and_wait(Job(f"warm{i}", total, args=(np.ones(4),)))

    def one(self, array: Any, want: str) -> Any:
        self.n += 1
        fn = total if want == "sum" else plus_one
        out = self.q.push_and_wait(self.Job(f"{want}:{self.n}", fn, args=(array,)))
        self.q.forget(f"{want}:{self.n}")
        return out

    def warm(self, array: Any, want: str) -> None:
        fn = total if want == "sum" else plus_one
        handles = [self.q.push(self.Job(f"warm-{want}-{i}", fn, args=(array,))).handle for i in range(2)]
        for handle in handles:
            handle.result()
            self.q.forget(handle.key)

    def many(self, arrays: list[Any]) -> list[float]:
        return list(self.q.map(total, arrays))

    def close(self) -> None:
        self.q.close()


class ProcqKeyed(Procq):
    """procq, its map given a key per item (a fresh one each map, so nothing is cached)."""

    name = "procq key="
    workloads = ("map",)

    def many(self, arrays: list[Any]) -> list[float]:
        self.n += 1
        return list(self.q.map(total, arrays, key=lambda a: f"many:{self.n}:{id(a)}"))


class Joblib(Engine):
    """joblib as most code calls it: a ``Parallel`` per call, over loky's
    reusable workers (started once). Each call removes the files it dumped
    arrays to as it returns; one ``Parallel`` kept open across calls would
    keep every one of them (gigabytes over a run)."""

    name = "joblib"

    def __init__(self) -> None:
        from joblib import Parallel, delayed

        self.Parallel = Parallel
        self.delayed = delayed
        self._run([delayed(total)(np.ones(4)) for _ in range(2)])

    def _run(self, tasks: Any) -> list[Any]:
        return list(self.Parallel(n_jobs=2, backend="loky")(tasks))

    def one(self, array: Any, want: str) -> Any:
        fn = total if want == "sum" else plus_one
        return self._run([self.delayed(fn)(array)])[0]

    def warm(self, array: Any, want: str) -> None:
        self._run(self.delayed(total if want == "sum" else plus_one)(array) for _ in range(2))

    def many(self, arrays: list[Any]) -> list[float]:
        return self._run(self.delayed(total)(a) for a in arrays)


class PPE(Engine):
    name = "ppe"

    def __init__(self) -> None:
        self.ex = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("forkserver"))
        list(self.ex.map(total, [np.ones(4)] * 2))

    def one(self, array: Any, want: str) -> Any:
        return self.ex.submit(total if want == "sum" else plus_one, array).result()

    def warm(self, array: Any, want: str) -> None:
        list(self.ex.map(total if want == "sum" else plus_one, [array, array]))

    def many(self, arrays: list[Any]) -> list[float]:
        return list(self.ex.map(total, arrays))

    def close(self) -> None:
        self.ex.shutdown()


class Ray(Engine):
    name = "ray"

    def __init__(self) -> None:
        import ray

        self.ray = ray
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
        self.total = ray.remote(total)
        self.plus_one = ray.remote(plus_one)
        ray.get([self.total.remote(np.ones(4)) for _ in range(2)])

    def one(self, array: Any, want: str) -> Any:
        fn = self.total if want == "sum" else self.plus_one
        return self.ray.get(fn.remote(self.ray.put(array)))

    def warm(self, array: Any, want: str) -> None:
        fn = self.total if want == "sum" else self.plus_one
        self.ray.get([fn.remote(self.ray.put(array)) for _ in range(2)])

    def many(self, arrays: list[Any]) -> list[float]:
        return list(self.ray.get([self.total.remote(self.ray.put(a)) for a in arrays]))

    def close(self) -> None:
        self.ray.shutdown()


class ShmFloor(Engine):
    name = "shm-floor"

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("forkserver")
        self.children = []
        self.segments: list[shared_memory.SharedMemory | None] = [None, None]  # each child's, grown as needed
        self.results: dict[str, shared_memory.SharedMemory] = {}  # the children's result segments, mapped
        for _ in range(2):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_floor_child, args=(child,), daemon=True)
            proc.start()
            child.close()
            self.children.append((proc, parent))
        self.many([np.ones(4)] * 2)

    def _send(self, i: int, array: Any, want: str) -> None:
        seg = self.segments[i]
        if seg is None or seg.size < array.nbytes:
            if seg is not None:
                seg.close()
                seg.unlink()
            seg = self.segments[i] = shared_memory.SharedMemory(create=True, size=max(array.nbytes, 1))
        np.copyto(np.ndarray(array.shape, dtype=np.float64, buffer=seg.buf), array)
        self.children[i][1].send((seg.name, array.shape, want))

    def _answer(self, i: int, shape: Any, want: str) -> Any:
        answer = self.children[i][1].recv()
        if want == "sum":
            return answer
        if answer not in self.results:
            self.results[answer] = shared_memory.SharedMemory(name=answer)
        return np.ndarray(shape, dtype=np.float64, buffer=self.results[answer].buf)

    def one(self, array: Any, want: str) -> Any:
        self._send(0, array, want)
        return self._answer(0, array.shape, want)

    def warm(self, array: Any, want: str) -> None:
        for child in range(2):
            self._send(child, array, want)
        for child in range(2):
            self._answer(child, array.shape, want)

    def many(self, arrays: list[Any]) -> list[float]:
        out: list[float] = []
        for i in range(0, len(arrays), 2):
            pair = arrays[i : i + 2]
            for child, a in enumerate(pair):
                self._send(child, a, "sum")
            out.extend(self._answer(child, a.shape, "sum") for child, a in enumerate(pair))
        return out

    def close(self) -> None:
        for proc, conn in self.children:
            conn.close()
            proc.join(10)
        for seg in [*self.segments, *self.results.values()]:
            if seg is not None:
                seg.close()
                seg.unlink()  # (removes it, and tells the resource tracker it is gone)


class ShmFloorInto(ShmFloor):
    """The floor, its child adding into its output segment (``np.add(array,
    1, out=...)``) instead of running the job and copying what it returns:
    what no engine can do with a job's function, shown for what it is."""

    name = "shm-floor out="
    workloads = ("in+out",)

    def one(self, array: Any, want: str) -> Any:
        return super().one(array, "into" if want == "plus" else want)

    def warm(self, array: Any, want: str) -> None:
        super().warm(array, "into" if want == "plus" else want)


class Memcpy(Engine):
    name = "memcpy"
    workloads = ("in", "in+out")

    def __init__(self) -> None:
        self.dst: Any = None

    def one(self, array: Any, want: str) -> Any:
        if self.dst is None or self.dst.shape != array.shape:
            self.dst = np.empty_like(array)
            self.dst[:] = 0  # (touched: the limit is the copy, not the page faults)
        np.copyto(self.dst, array)
        return None

    def warm(self, array: Any, want: str) -> None:
        self.one(array, want)

    def many(self, arrays: list[Any]) -> list[float]:
        for a in arrays:
            self.one(a, "sum")
        return []


def _available() -> list[tuple[str, Callable[[], Engine]]]:
    engines: list[tuple[str, Callable[[], Engine]]] = [("procq", Procq), ("procq key=", ProcqKeyed)]
    try:
        import joblib  # noqa: F401

        engines.append(("joblib", Joblib))
    except ImportError:
        print("skipped joblib: not installed")
    engines.append(("ppe", PPE))
    try:
        import ray  # noqa: F401

        engines.append(("ray", Ray))
    except ImportError:
        print("skipped ray: not installed")
    engines += [("shm-floor", ShmFloor), ("shm-floor out=", ShmFloorInto), ("memcpy", Memcpy)]
    return engines


# --- running ------------------------------------------------------------------------


def _time(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(mib: int, map_n: int, map_mib: int, rounds: int) -> dict[tuple[str, str], float]:
    """Every engine's median GB/s of each workload (``in``, ``in+out``, ``map``)."""
    big = np.random.default_rng(0).standard_normal(mib * MIB // 8)
    arrays = [np.full(map_mib * MIB // 8, float(i)) for i in range(map_n)]
    engines = [(name, make()) for name, make in _available()]
    times: dict[tuple[str, str], list[float]] = {}
    try:
        for _, engine in engines:  # (untimed: each engine's steady state, at this size, on both workers)
            engine.warm(big, "sum")
            engine.warm(big, "plus")
            if "map" in engine.workloads:
                engine.many([a.view() for a in arrays[:8]])
        for r in range(rounds):
            turn = engines[r % len(engines) :] + engines[: r % len(engines)]
            for name, engine in turn:
                # Fresh data for each job, as new arrays (views: no copy) with
                # new values: see the module docstring.
                for workload, want in (("in", "sum"), ("in+out", "plus")):
                    if workload in engine.workloads:
                        # One untimed job first: the timed one follows a job of its
                        # own engine, as in any run of many jobs, not the last
                        # engine's churn (after gigabytes pickled, dumped and freed,
                        # the kernel may stall a job's new 256 MiB array for up to a
                        # second, compacting memory to back it with huge pages).
                        big[0] += 1.0
                        engine.one(big.view(), want)
                        big[0] += 1.0
                        fresh = big.view()
                        took = _time(lambda e=engine, a=fresh, w=want: e.one(a, w))
                        times.setdefault((name, workload), []).append(took)
                if "map" in engine.workloads:
                    for a in arrays:
                        a[0] += 1.0
                    views = [a.view() for a in arrays]
                    times.setdefault((name, "map"), []).append(_time(lambda e=engine, v=views: e.many(v)))
    finally:
        for _, engine in engines:
            engine.close()
    sizes = {"in": big.nbytes, "in+out": big.nbytes, "map": sum(a.nbytes for a in arrays)}
    return {key: sizes[key[1]] / statistics.median(values) / 1e9 for key, values in times.items()}


def sweep(sizes_kib: list[int], samples: int) -> None:
    """The threshold, measured: the median round trip of one job (an array
    in, its sum out; an array in and ``array + 1`` out) for each size, with
    buffers out of band through shared memory from ``OOB_BYTES`` on (procq's
    way) and with everything in the pipe, on one worker."""
    import procq._wire.oob
    from procq import Job, ProcQueue

    default = procq._wire.oob.OOB_BYTES
    print(f"round trip, median of {samples} (us); shared memory from {default >> 10} KiB on by default")
    print(f"{'size':>9} {'in: pipe':>10} {'in: shm':>9} {'in+out: pipe':>13} {'in+out: shm':>12}")
    with ProcQueue(1) as q:
        n = 0
        for kib in sizes_kib:
            array = np.random.default_rng(kib).standard_normal(kib * 1024 // 8)
            cells = []
            for want in ("sum", "plus"):
                for threshold in (1 << 62, 1):  # everything in the pipe; every buffer out of band
                    procq._wire.oob.OOB_BYTES = threshold
                    q.push_and_wait(Job(f"set{n}", set_threshold, args=(threshold,)))
                    fn = total if want == "sum" else plus_one
                    times = []
                    for _ in range(samples):
                        n += 1
                        array[0] += 1.0
                        job = Job(f"j{n}", fn, args=(array.view(),))
                        times.append(_time(lambda j=job: q.push_and_wait(j)))
                        q.forget(job.key)
                    cells.append(statistics.median(times) * 1e6)
            print(f"{kib:>5} KiB {cells[0]:>10.0f} {cells[1]:>9.0f} {cells[2]:>13.0f} {cells[3]:>12.0f}")
    procq._wire.oob.OOB_BYTES = default


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.arrays", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 MiB arrays, a 40 x 4 MiB map, 1 round")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5; 1 with --quick)")
    parser.add_argument("--mib", type=int, default=None, help="size of the large array in MiB (default 256)")
    parser.add_argument(
        "--sweep", action="store_true", help="instead: one job's round trip by size, through the pipe and out of band"
    )
    args = parser.parse_args(argv)
    if args.sweep:
        sweep([16, 64, 128, 160, 192, 224, 256, 512, 4096], 9 if args.quick else 41)
        return 0
    rounds = args.rounds or (1 if args.quick else 5)
    mib = args.mib or (64 if args.quick else 256)
    map_n, map_mib = (40, 4) if args.quick else (200, 16)
    info = report.machine()
    print("procq large-array benchmark: one job at a time (the map: all through 2 workers), 2 workers each")
    print(f"machine: {info['nproc']} CPUs, {info['cpu']}; {info['python']}; {info['os']}")
    print(f"procq at commit {report.revision()}; load average (1 min) at start: {report.loadavg()}")
    print(f"array {mib} MiB (float64); map {map_n} x {map_mib} MiB; {rounds} round(s), medians")
    rates = measure(mib, map_n, map_mib, rounds)
    workloads = ("in", "in+out", "map")
    print()
    print(f"{'GB/s (median)':<14}" + "".join(f"{w:>22}" for w in workloads))
    for name in dict.fromkeys(engine for engine, _ in rates):
        cells = []
        for w in workloads:
            rate = rates.get((name, w))
            if rate is None:
                cells.append(f"{'-':>22}")
            elif name == "procq":
                cells.append(f"{rate:>22.2f}")
            else:
                cells.append(f"{rate:>8.2f} (procq {rates[('procq', w)] / rate:>5.2f}x)")
        print(f"{name:<14}" + "".join(cells))
    print()
    _targets(rates)
    return 0


def _targets(rates: dict[tuple[str, str], float]) -> None:
    for _, workload, peer, least, what in report.ARRAY_TARGETS:
        if (peer, workload) not in rates:
            print(f"n/a     {what}: {peer} did not run")
            continue
        got = rates[("procq", workload)] / rates[(peer, workload)]
        print(f"{'met' if got >= least else 'missed':<7} {what}: {got:.2f}x")
    if ("shm-floor out=", "in+out") in rates:
        got = rates[("procq", "in+out")] / rates[("shm-floor out=", "in+out")]
        print(f"{'':<7} (an array in, an array out, beside the floor that adds into its segment: {got:.2f}x)")
    if ("procq key=", "map") in rates and ("shm-floor", "map") in rates:
        got = rates[("procq key=", "map")] / rates[("shm-floor", "map")]
        verdict = "met" if got >= 0.5 else "missed"
        print(f"{verdict:<7} the same map, a key per item (key=): >= 0.5x the floor: {got:.2f}x")


def run_arrays(peer: Any, cfg: Config, tmp: str) -> dict[str, float]:
    """``python -m bench``'s workload: one round of every engine here (procq's
    row of the table holds the figures, its ratios to the others among them)."""
    rates = measure(cfg.array_mib, cfg.array_map_items, cfg.array_map_mib, rounds=1)
    figures = {
        "in_gbps": rates[("procq", "in")],
        "inout_gbps": rates[("procq", "in+out")],
        "map_gbps": rates[("procq", "map")],
        "mapkey_gbps": rates[("procq key=", "map")],
        "floor_in_gbps": rates[("shm-floor", "in")],
        "floor_inout_gbps": rates[("shm-floor", "in+out")],
        "floor_map_gbps": rates[("shm-floor", "map")],
        "floor_into_gbps": rates[("shm-floor out=", "in+out")],
        "memcpy_gbps": rates[("memcpy", "in")],
    }
    for figure, workload, other, _, _ in report.ARRAY_TARGETS:
        if (other, workload) in rates:
            figures[figure] = rates[("procq", workload)] / rates[(other, workload)]
    if ("ray", "in") in rates:
        figures["ray_in_gbps"] = rates[("ray", "in")]
    return figures


_GBPS = num("{:.2f}")
ARRAYS = Workload(
    "arrays",
    "large float64 arrays: in (sum out), in and out (array + 1), a map; beside joblib/loky, Ray, a floor, memcpy",
    run_arrays,
    (
        Metric("in_gbps", "in, sum out, GB/s", "higher", _GBPS, ratio=False),
        Metric("inout_gbps", "in, array out, GB/s", "higher", _GBPS, ratio=False),
        Metric("map_gbps", "map (default keys), GB/s", "higher", _GBPS, ratio=False),
        Metric("mapkey_gbps", "map (key=), GB/s", "higher", _GBPS, ratio=False),
        Metric("floor_in_gbps", "shared-memory floor: in, GB/s", "-", _GBPS, ratio=False),
        Metric("floor_inout_gbps", "shared-memory floor: in and out, GB/s", "-", _GBPS, ratio=False),
        Metric("floor_map_gbps", "shared-memory floor: map, GB/s", "-", _GBPS, ratio=False),
        Metric("floor_into_gbps", "the floor adding into its segment: in and out, GB/s", "-", _GBPS, ratio=False),
        Metric("memcpy_gbps", "memcpy in one process, GB/s", "-", _GBPS, ratio=False),
        Metric("ray_in_gbps", "Ray: in, GB/s (if installed)", "-", _GBPS, ratio=False),
        Metric("in_floor", "in / floor", "higher", _GBPS, ratio=False),
        Metric("in_joblib", "in / joblib", "higher", _GBPS, ratio=False),
        Metric("inout_floor", "in and out / floor", "higher", _GBPS, ratio=False),
        Metric("inout_joblib", "in and out / joblib", "higher", _GBPS, ratio=False),
        Metric("map_floor", "map / floor", "higher", _GBPS, ratio=False),
    ),
    engines=("procq",),
    notes=("each round runs every engine of python -m bench.arrays (2 workers each, in their steady state)",),
)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
