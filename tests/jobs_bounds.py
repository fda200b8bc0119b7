"""Hostile jobs for a sandbox's bounds (test_sandbox_bounds, sandbox_program):
a fork bomb, a disk filler, a memory hog. Each reports what it managed."""

from __future__ import annotations

import errno
import os
import tempfile
from typing import Any

#: How far the fork bomb goes unbounded: each process forks 2, to this depth (2**7 - 1 processes).
_BOMB_DEPTH = 6


def fork_bomb() -> dict[str, Any]:
    """Every process forks two more (to a depth that stays harmless
    unbounded) until the kernel refuses a fork. On an event pipe, a process
    writes ``+`` before each fork (``-`` after it if the fork failed), then
    ``=`` once it is done forking: a process's ``+`` comes before anything
    it writes, and its ``=`` after its children's ``+``. So when there is one
    ``=`` more than processes counted, every process has tried, and the
    job's own process counts them (itself included) and lets them all exit."""
    events_r, events_w = os.pipe()
    hold_r, hold_w = os.pipe()
    refused: list[str] = []

    def spread(depth: int) -> None:
        for _ in range(2):
            if depth >= _BOMB_DEPTH:
                break
            os.write(events_w, b"+")
            try:
                pid = os.fork()
            except OSError as exc:
                refused.append(errno.errorcode.get(exc.errno or 0, str(exc.errno)))
                os.write(events_w, b"-")
                break
            if pid == 0:  # a child: spread, then wait to be let go
                if depth == 0:
                    os.close(hold_w)  # (a grandchild is forked without it)
                spread(depth + 1)
                os.read(hold_r, 1)
                os._exit(0)
        os.write(events_w, b"=")

    spread(0)
    started, done, failed = 0, 0, 0
    while done < started + 1:
        for byte in os.read(events_r, 4096):
            started += byte == ord("+")
            done += byte == ord("=")
            started -= byte == ord("-")
            failed += byte == ord("-")
    os.close(hold_w)  # every process waiting on it exits
    return {"processes": started + 1, "refused": failed, "why": sorted(set(refused))}


def fill_tmp(mib: int) -> dict[str, Any]:
    """Write ``mib`` MiB to a file in the job's temporary directory."""
    tmp = tempfile.gettempdir()
    written = 0
    try:
        with open(os.path.join(tmp, "filler"), "wb") as f:
            chunk = b"x" * (1 << 20)
            for _ in range(mib):
                f.write(chunk)
                f.flush()
                written += 1
    except OSError as exc:
        return {"tmp": tmp, "written": written, "error": errno.errorcode.get(exc.errno or 0, str(exc))}
    return {"tmp": tmp, "written": written, "error": None}


def tmp_exists(path: str) -> bool:
    return os.path.exists(path)


def hog(mib: int) -> int:
    """Allocate and touch ``mib`` MiB."""
    block = b"\x01" * (mib << 20)
    return len(block)


def spawn_and_hang(children: int) -> None:
    """Fork ``children`` processes, then wait forever with them (until the job's timeout kills the tree)."""
    hold_r, _ = os.pipe()
    for _ in range(children):
        if os.fork() == 0:
            os.read(hold_r, 1)
            os._exit(0)
    os.read(hold_r, 1)
