"""Process helpers for the tests of crashes, processes and supervisor deaths (not job code)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

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


@contextlib.contextmanager
def tagged_program(argv: list[str], tag: str) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``argv`` (a supervisor program a test wrote) with ``PROCQ_TEST_TAG=tag``,
    which everything it starts inherits, under ``subreaper()``. On the way out, it
    and every tagged process still running are SIGKILLed and reaped, and its pipes
    closed."""
    with subreaper():
        env = dict(os.environ, PROCQ_TEST_TAG=tag)
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            kill_and_reap(descendants_tagged(tag))
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()


def assert_all_gone(procs: list[psutil.Process], tag: str, what: str) -> None:
    """``procs``, and every process tagged ``tag``, exit within 5 s of their supervisor."""
    _, alive = psutil.wait_procs(procs, timeout=5)
    assert [p.pid for p in alive] == [], f"{what} outlived its supervisor"
    _, alive = psutil.wait_procs(descendants_tagged(tag), timeout=5)
    assert [p.pid for p in alive] == [], "a process outlived its supervisor"


def json_program(argv: list[str], timeout: float) -> dict[str, Any]:
    """Run a test's program (in a session of its own, from ``/``) to its end:
    the JSON object of its output's last line. Past ``timeout`` its whole
    session is killed and the test fails with what it wrote to stderr; a
    non-zero exit status fails it too."""
    import json
    import signal

    import pytest

    with subprocess.Popen(argv, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as program:  # fmt: skip
        try:
            out, err = program.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(program.pid, signal.SIGKILL)
            out, err = program.communicate(timeout=10)
            pytest.fail(f"the program did not finish within {timeout:g} s: {err[-3000:]}")
    assert program.returncode == 0, err[-3000:]
    said: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return said
