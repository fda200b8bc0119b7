"""``python -m bench.starts {forkserver,crashes}``: what a worker's start costs, in CPU.

``forkserver [-n N] [--preload MODULE,...]``: a ``multiprocessing`` forkserver
that preloads the given modules (default: what procq has it preload), and
``bench.jobs``, starts N children one after another, each of which exits at
once. Prints the server's resident memory and, per start, the CPU of the
server and its reaped children (``/proc/<server>/stat``) and of this process:
what a fork of that image and an exit cost, whoever asks for them.

``crashes [-n N]``: N jobs in a row on ``ProcQueue(lanes=1)``, each SIGKILLing
its worker, so each is followed by a replacement. Prints per crash the wall
time, this process's CPU (the supervisor and the caller) and the CPU of the
forkserver and of the workers it forked.

A package run with ``-m``, so that no child imports the main module (as
each child of a forkserver that has not imported it does, with a script or
a plain module: procq's forkserver imports it once, see
``procq._worker.forkserver_main``), and with
``bench.jobs`` preloaded: each start costs only the fork, the child's
``multiprocessing`` bootstrap and its exit.

Each run measures one configuration in a fresh process. To compare two
commits, run it from each checkout in turn, several times each: the host's
speed drifts more than most changes move these figures.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from typing import Any

from bench import jobs
from bench.engines import preload_jobs_module

TICK = os.sysconf("SC_CLK_TCK")


def _cpu_with_children(pid: int) -> float:
    """The process's CPU seconds, with its reaped children's."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / TICK


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _server_pid() -> int:
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver  # private: the only way to name the server
    pid = server._forkserver_pid
    assert pid is not None, "the forkserver has not started"
    return int(pid)


def forkserver_starts(n: int, preload: list[str] | None) -> str:
    context = multiprocessing.get_context("forkserver")
    if preload is None:
        from procq._api.config import preload_worker

        preload_worker(context)
    else:
        context.set_forkserver_preload(preload)
    preload_jobs_module(context)
    first = context.Process(target=jobs.exit_now)
    first.start()
    first.join()
    server = _server_pid()
    server0, own0, wall0 = _cpu_with_children(server), time.process_time(), time.perf_counter()
    for _ in range(n):
        child = context.Process(target=jobs.exit_now)
        child.start()
        child.join()
    wall, own = time.perf_counter() - wall0, time.process_time() - own0
    server_cpu = _cpu_with_children(server) - server0
    what = "procq's preload" if preload is None else ",".join(preload) or "nothing"
    return (
        f"forkserver preloading {what}: RSS {_rss_mb(server):.0f} MB; per start: wall {wall / n * 1e3:.2f} ms,"
        f" server and children CPU {server_cpu / n * 1e3:.2f} ms, this process {own / n * 1e3:.2f} ms"
    )


def crashes(n: int) -> str:
    from procq import Job, JobFailed, ProcQueue

    multiprocessing.set_forkserver_preload([jobs.__name__])  # procq keeps it beside its own
    with ProcQueue(lanes=1, start_method="forkserver") as q:
        q.push_and_wait(Job("warm", jobs.noop), timeout=60)
        server = _server_pid()
        server0, own0, wall0 = _cpu_with_children(server), time.process_time(), time.perf_counter()
        for i in range(n):
            try:
                q.push_and_wait(Job(f"crash-{i}", jobs.die), timeout=60)
            except JobFailed as exc:
                assert exc.failure.kind == "crashed", exc.failure
            else:
                raise AssertionError("a job that SIGKILLs its worker returned")
        q.push_and_wait(Job("last", jobs.noop), timeout=60)  # the last replacement is up
        wall, own = time.perf_counter() - wall0, time.process_time() - own0
        server_cpu = _cpu_with_children(server) - server0
    return (
        f"{n} crashes in a row on one worker: per crash, wall {wall / n * 1e3:.2f} ms,"
        f" supervisor and caller CPU {own / n * 1e3:.2f} ms, forkserver and workers CPU {server_cpu / n * 1e3:.2f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.starts", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("what", choices=["forkserver", "crashes"])
    parser.add_argument("-n", type=int, default=None, help="starts (default 300) or crashes (default 60)")
    parser.add_argument("--preload", default=None, help="forkserver: modules to preload, comma-separated")
    args = parser.parse_args(argv)
    if args.what == "forkserver":
        preload = None if args.preload is None else [m for m in args.preload.split(",") if m]
        print(forkserver_starts(args.n or 300, preload))
    else:
        print(crashes(args.n or 60))
    return 0
