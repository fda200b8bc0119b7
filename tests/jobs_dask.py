"""Job functions for test_dask, run in procq's worker processes on the Dask
workers (which have ``tests/`` on their path)."""

from __future__ import annotations

import os

import jobs


def pids() -> tuple[int, int]:
    """This process's pid and its parent's: the procq worker process and its Dask worker."""
    return os.getpid(), os.getppid()


def report_then_block(started: str) -> None:
    """Tell the test "<pid> <Dask worker's pid>", then block until killed."""
    jobs.signal_test(started, f"{os.getpid()} {os.getppid()}".encode())
    jobs.block_forever()


def block_once(started: str, marker: str) -> str:
    """The first attempt reports and blocks (its Dask worker is killed under
    it); a later one returns at once."""
    if os.path.exists(marker):
        return "second attempt"
    with open(marker, "w"):
        pass
    report_then_block(started)
    return "unreachable"


def append_and_wait(log: str, started: str, go: str) -> int:
    """Log one run of the job, then wait on the gate (for the push races)."""
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    return jobs.signal_and_wait(started, go)


def allocate(megabytes: int) -> int:
    """Hold ``megabytes`` of touched memory, then block (a memory limit ends it)."""
    held = bytearray(megabytes * 1024 * 1024)
    for i in range(0, len(held), 4096):
        held[i] = 1
    jobs.block_forever()
    return len(held)
