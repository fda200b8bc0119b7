"""Process helpers for test_crashes and test_processes (not job code)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator

import psutil

_PR_SET_CHILD_SUBREAPER = 36

linux_only = sys.platform.startswith("linux")


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    """Make this process adopt (and so be able to reap) its orphaned descendants.

    A process whose parent dies is re-parented to the nearest "child subreaper"
    above it, or to PID 1, which in a container may never reap it. While this is
    on, every orphan of ours becomes our child: ``psutil.wait_procs`` then sees it
    exit and reaps it, so a test can tell "gone" from "still running" exactly.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    try:
        yield
    finally:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def children() -> dict[int, psutil.Process]:
    """This process's children and their descendants, by pid."""
    return {p.pid: p for p in psutil.Process().children(recursive=True)}


def descendants_tagged(tag: str) -> list[psutil.Process]:
    """Our descendants that carry ``PROCQ_TEST_TAG=tag`` in their environment
    (a supervisor script a test started, and everything it started)."""
    found = []
    for p in children().values():
        try:
            if p.environ().get("PROCQ_TEST_TAG") == tag:
                found.append(p)
        except psutil.Error:
            pass
    return found


def kill_and_reap(procs: list[psutil.Process]) -> None:
    """SIGKILL the given processes (by pid, only those still running) and reap them."""
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(procs, timeout=10)
