"""What a sandboxed lane costs over today's untrusted lane.

    python -m bench.sandbox            # about 40 s here
    python -m bench.sandbox --quick    # a few seconds

round trip
    Sequential ``push_and_wait`` of a no-op job (``bench.jobs.noop``, a fresh
    key each), one worker, on ``Lane(trusted=False)``, on
    ``Lane(trusted=False, sandbox=True)`` (the default bounds: 256
    processes, 256 MiB of temporary files) and on a sandbox without bounds
    (``max_processes=None, max_tmp=None``: what the bounds cost is the
    difference), in the same run, alternating rounds. The median per job of
    each round; the target is at most 3 ms more per job for the sandboxed lane.

worker start
    ``ProcQueue()`` to the first job's answer, then ``close()``, for each
    kind, alternating. The kernel probe a sandboxed lane needs is made once
    per process, before anything is timed, and timed on its own.

where the time goes
    The sandbox's steps timed alone, each in a process forked for it as a
    job's process is: the Landlock domain an untrusted job gets today; the
    sandbox's Landlock domain (its rules); the seccomp filter; and, per
    worker, entering the namespaces and building the view (the probe's
    step); a job's process joining its worker's cgroups (where this process
    may make them). The worker's own per-job steps (a temporary directory
    made and removed, leftovers reaped) are timed in this process.

a network allow-list
    A download and connection set-up, straight out and through procq's
    proxy: see ``bench.sandbox_network``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

from bench import sandbox_network
from bench.jobs import noop
from procq import Job, Lane, ProcQueue, Sandbox
from procq._system.processes import import_path
from procq._system.sandbox import kernel

KINDS = {
    "untrusted": lambda: Lane(workers=1, trusted=False),
    "unbounded": lambda: Lane(workers=1, trusted=False, sandbox=Sandbox(max_processes=None, max_tmp=None)),
    "sandboxed": lambda: Lane(workers=1, trusted=False, sandbox=True),
}


def round_trip(kind: str, jobs: int) -> float:
    """Median ms per sequential no-op job on a warm worker of ``kind``."""
    with ProcQueue({"b": KINDS[kind]()}) as q:
        q.push_and_wait(Job("warm", noop))
        times = []
        for i in range(jobs):
            began = time.perf_counter()
            q.push_and_wait(Job(f"{kind}-{i}-{time.monotonic_ns()}", noop))
            times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def start(kind: str) -> float:
    """ms from ProcQueue() to the first job's answer."""
    began = time.perf_counter()
    with ProcQueue({"b": KINDS[kind]()}) as q:
        q.push_and_wait(Job("first", noop))
        took = time.perf_counter() - began
    return took * 1e3


def in_child(step: Callable[[], None], samples: int) -> float:
    """Median ms of ``step`` in a process forked for it, as a job's process is."""
    times = []
    for _ in range(samples):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the forked child
            os.close(read)
            began = time.perf_counter()
            try:
                step()
                took = time.perf_counter() - began
            except BaseException:
                took = -1.0
            os.write(write, repr(took).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            took = float(f.read() or -1)
        os.waitpid(pid, 0)
        if took < 0:
            raise RuntimeError("a step failed in its child")
        times.append(took)
    return statistics.median(times) * 1e3


def steps(samples: int) -> dict[str, float]:
    import ctypes
    import shutil
    import tempfile

    from procq._system import cgroups
    from procq._system import seccomp as _seccomp
    from procq._system.privileges import confine_job, landlock_abi, libc
    from procq._system.sandbox_linux import _probe_namespaces, confine, default_reads
    from procq._worker.sandbox import WorkerSandbox

    abi = landlock_abi()  # (and libc loaded here, as a worker has it before it forks)
    libc()
    reads = default_reads(import_path())
    filt = _seccomp.program(False)
    # The jobs' temporary directories live on a tmpfs (the view's /tmp): time them on one.
    tmp = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    libc = ctypes.CDLL(None, use_errno=True)

    def no_new_privs() -> None:
        libc.prctl(38, 1, 0, 0, 0)

    def plain() -> None:
        no_new_privs()
        confine_job(abi)

    def rules() -> None:
        confine(abi, reads, [tmp], False, False, None)

    def seccomp() -> None:
        no_new_privs()
        _seccomp.install(filt)

    def view() -> None:
        if _probe_namespaces() is not None:
            raise RuntimeError("no namespaces")

    def nothing() -> None:
        pass

    out = {
        "nothing, in a forked child (floor)": in_child(nothing, samples),
        "today's untrusted job: Landlock domain (per job)": in_child(plain, samples),
        f"sandbox: Landlock domain with {len(reads) + 7} rules (per job)": in_child(rules, samples),
        "sandbox: seccomp filter (per job)": in_child(seccomp, samples),
    }
    worker = WorkerSandbox.__new__(WorkerSandbox)  # its per-job steps only: no namespaces entered here
    worker.tmp_root, worker.namespaces, worker.cgroup = tmp, False, None
    times = []
    for _ in range(samples):
        began = time.perf_counter()
        worker.after(worker.job_dir())
        times.append(time.perf_counter() - began)
    out["sandbox: the job's temporary directory made and removed (per job, in the worker)"] = (
        statistics.median(times) * 1e3
    )
    out["sandbox: namespaces and the view, in a forked child (per worker)"] = in_child(view, max(3, samples // 10))
    places = {name: place for name, place in cgroups.usable().items() if isinstance(place, cgroups.Place)}
    if places:
        dirs = cgroups.make(places, 256, None)
        try:
            job_cgroup = cgroups.JobCgroup(dirs, places.get("memory", places["pids"]).version)
            out[f"bounds: joining the worker's {len(set(dirs.values()))} cgroups (per job)"] = in_child(
                job_cgroup.join, samples
            )
        finally:
            cgroups.remove(list(dirs.values()))
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sandbox", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer jobs and rounds")
    args = parser.parse_args(argv)
    jobs, rounds, starts, samples = (30, 2, 3, 10) if args.quick else (200, 5, 10, 50)
    began = time.perf_counter()
    kernel()
    probe_ms = (time.perf_counter() - began) * 1e3
    trips: dict[str, list[float]] = {k: [] for k in KINDS}
    boots: dict[str, list[float]] = {k: [] for k in KINDS}
    for _ in range(rounds):
        for kind in KINDS:
            trips[kind].append(round_trip(kind, jobs))
    for _ in range(starts):
        for kind in KINDS:
            boots[kind].append(start(kind))
    print(f"# bench.sandbox: Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.2f}; {rounds} rounds of {jobs} jobs, {starts} starts")  # fmt: skip
    print()
    print("| figure | untrusted | sandboxed, unbounded | sandboxed | sandboxed - untrusted | sandboxed - unbounded |")
    print("|---|---|---|---|---|---|")
    for name, figures in (("round trip, median ms per job", trips), ("worker start + first job, median ms", boots)):
        u, n, s = (statistics.median(figures[kind]) for kind in ("untrusted", "unbounded", "sandboxed"))
        print(f"| {name} | {u:.2f} | {n:.2f} | {s:.2f} | {s - u:+.2f} | {s - n:+.2f} |")
    extra = statistics.median(trips["sandboxed"]) - statistics.median(trips["untrusted"])
    print()
    print(f"[{'MET' if extra <= 3.0 else 'MISSED'}] at most 3 ms more per job: {extra:+.2f} ms")
    print(f"kernel probe (once per process): {probe_ms:.1f} ms")
    print()
    print("| step | median ms |")
    print("|---|---|")
    for name, ms in steps(samples).items():
        print(f"| {name} | {ms:.3f} |")
    print()
    print("\n".join(sandbox_network.run(args.quick)))  # a network allow-list: through procq's proxy
    sys.stdout.flush()


if __name__ == "__main__":
    main()
