"""A real Dask cluster on loopback for test_dask: a ``dask scheduler`` and two
``dask worker`` processes (each a nanny and its worker), started as the
command line starts them, each in a session of its own.

The scheduler runs with ``allowed-failures`` 0, as a ``DaskLane`` requires.
The workers import the tests' job modules (``tests/`` is on their path). The
test process is a child subreaper while the cluster runs, so a procq worker
process orphaned on the far side (its Dask worker killed) is still ours to
see and reap: "no process left" can be checked on both sides.
"""

from __future__ import annotations

import contextlib
import copyreg
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from process_support import subreaper

TESTS = str(Path(__file__).resolve().parent)
#: Bound on starting the cluster (processes on 2 busy cores).
START_TIMEOUT = 60.0


def import_distributed() -> Any:
    """``distributed``, or the calling test module skipped when it is missing
    (failed under CI, which installs procq[dask]: there it is a broken install).

    Importing it installs tblib's pickling of exceptions for the whole process
    (``copyreg``); other test modules compare pickles byte for byte, so that is
    undone here (the client in this process does not need it)."""
    reducers = dict(copyreg.dispatch_table)
    try:
        import distributed
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip("distributed is not installed (pip install 'procq[dask]')", allow_module_level=True)
    copyreg.dispatch_table.clear()
    copyreg.dispatch_table.update(reducers)
    return distributed


def _dask(*args: str) -> list[str]:
    return [sys.executable, "-m", "distributed.cli.dask_" + args[0], *args[1:]]


class Cluster:
    """The processes of one cluster, and a client the tests use to look at it."""

    def __init__(self, directory: Path) -> None:
        self.file = str(directory / "scheduler.json")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([TESTS, *filter(None, [os.environ.get("PYTHONPATH")])]),
            "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0",
        }
        env.pop("PROCQ_TEST_TAG", None)
        self._logs = logs = open(directory / "cluster.log", "wb")  # noqa: SIM115 - closed in stop()
        common: dict[str, Any] = {"env": env, "cwd": TESTS, "stdout": logs, "stderr": logs, "start_new_session": True}
        self.scheduler = subprocess.Popen(
            _dask("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file", self.file),
            **common,
        )
        self.address = self._wait_for_address()
        worker = ["--host", "127.0.0.1", "--nworkers", "1", "--nthreads", "2", "--no-dashboard", "--memory-limit", "0"]
        self.nannies = [
            subprocess.Popen(_dask("worker", self.address, *worker, "--name", f"w{i}"), **common) for i in range(2)
        ]
        import distributed

        self.client = distributed.Client(self.address, timeout=START_TIMEOUT, set_as_default=False)
        self.client.wait_for_workers(2, timeout=START_TIMEOUT)

    def _wait_for_address(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:  # (the scheduler writes the file once it listens)
            with contextlib.suppress(OSError, ValueError), open(self.file) as f:
                return str(json.load(f)["address"])
            if self.scheduler.poll() is not None:
                raise RuntimeError(f"dask scheduler exited with {self.scheduler.returncode}")
            time.sleep(0.05)
        raise TimeoutError(f"dask scheduler wrote no address within {START_TIMEOUT}s")

    def worker_pids(self) -> dict[str, int]:
        """Each Dask worker's address and process id."""
        info = self.client.run(os.getpid)
        return {address: int(pid) for address, pid in info.items()}

    def wait_for_workers(self, n: int = 2) -> None:
        self.client.wait_for_workers(n, timeout=START_TIMEOUT)
        deadline = time.monotonic() + START_TIMEOUT
        while len(self.client.scheduler_info(n_workers=-1)["workers"]) < n and time.monotonic() < deadline:
            time.sleep(0.05)

    def infrastructure(self) -> set[int]:
        """The cluster's own processes now: scheduler, nannies, workers (and a
        worker's multiprocessing helpers). Not the procq processes below them."""
        pids = {self.scheduler.pid}
        for nanny in self.nannies:
            pids.add(nanny.pid)
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(nanny.pid).children():
                    pids.add(child.pid)
                    pids.update(p.pid for p in child.children() if _is_helper(p))
        return pids

    def procq_processes(self) -> list[psutil.Process]:
        """procq's worker processes on the cluster's side (and any orphan of theirs)."""
        found = []
        for p in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "procq._cluster.remote" in " ".join(p.cmdline()):
                    found.append(p)
        return found

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close(timeout=10)
        procs = [*self.nannies, self.scheduler]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for proc in procs:  # whatever is left of their sessions
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        self._logs.close()


def _is_helper(p: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return "procq._cluster.remote" not in " ".join(p.cmdline())
    return False


@contextlib.contextmanager
def running_cluster(directory: Path) -> Iterator[Cluster]:
    with subreaper():
        cluster = Cluster(directory)
        try:
            yield cluster
        finally:
            sessions = {cluster.scheduler.pid, *(n.pid for n in cluster.nannies)}
            cluster.stop()
            left = cluster.procq_processes()
            for p in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error, OSError):
                    if os.getsid(p.pid) in sessions:
                        left.append(p)
            _, alive = psutil.wait_procs(left, timeout=10)
            assert not alive, f"processes left after the cluster stopped: {alive}"
