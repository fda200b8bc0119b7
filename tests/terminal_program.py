"""A supervisor for test_terminal, run as a program of its own with a
pseudo-terminal as its controlling terminal and its fds 0, 1 and 2
(``root`` or ``nobody``: as that user, after ``sandbox_program``'s way of
becoming it).

It asks for a line to be typed and waits until the terminal holds it, then
runs a job in a plain untrusted lane and one in a sandboxed lane that go for
the terminal (``jobs_terminal``); then reads the line itself, and checks its
terminal's modes and size. Then a job prints ``FLOOD`` MiB while a trusted
canary lane is asked a job after another. The last line of its output is a
JSON object of what it saw."""

from __future__ import annotations

import fcntl
import json
import os
import resource
import select
import struct
import sys
import termios
import threading
import time
from typing import Any

FLOOD = 1024  # MiB


def _terminal() -> dict[str, Any]:
    attrs = termios.tcgetattr(0)
    rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(0, termios.TIOCGWINSZ, b"\0" * 8))
    return {"echo": bool(attrs[3] & termios.ECHO), "size": [rows, cols]}


def main() -> None:
    mode, here, root = sys.argv[1:4]
    sys.path[:0] = [root, here]
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # (a session leader, started with no controlling terminal)
    if mode == "nobody":
        import sandbox_program

        sandbox_program._passable_for_others([os.path.realpath(sys.executable), sys.executable, here, root])
        sandbox_program._become_nobody()
    import jobs_sandbox as js
    import jobs_terminal as jt

    from procq import Job, Lane, ProcQueue, Sandbox

    said: dict[str, Any] = {"uid": os.getuid(), "terminal before": _terminal()}
    print("TYPE A LINE", flush=True)
    said["line typed"] = bool(select.select([0], [], [], 60)[0])  # (a whole line: the terminal is canonical)
    lanes = {
        "untrusted": Lane(workers=1, trusted=False),
        "sandboxed": Lane(workers=1, trusted=False, sandbox=Sandbox()),
        "canary": Lane(workers=1),
    }
    with ProcQueue(lanes) as q:
        for lane in ("untrusted", "sandboxed"):
            said[lane] = q.push_and_wait(Job(f"go {lane}", jt.go_for_the_terminal, args=(lane,), lane=lane), timeout=60)
        said["terminal after"] = _terminal()
        said["line read"] = sys.stdin.readline()

        answered: list[float] = []
        flooding = threading.Event()
        flooding.set()

        def canary() -> None:
            n = 0
            while flooding.is_set():
                n += 1
                start = time.monotonic()
                assert q.push_and_wait(Job(f"canary {n}", js.square, args=(7,), lane="canary"), timeout=30) == 49
                answered.append(time.monotonic() - start)
                time.sleep(0.05)  # (a pace, not a wait for anything)

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        thread = threading.Thread(target=canary)
        thread.start()
        try:
            said["flood"] = q.push_and_wait(Job("flood", jt.flood, args=(FLOOD,), lane="untrusted"), timeout=300)
        finally:
            flooding.clear()
            thread.join(60)  # (its last push waits 30 s at most)
        said["peak growth KiB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
        said["canaries"] = len(answered)
        said["slowest canary"] = max(answered)
    print()
    print("RESULT " + json.dumps(said), flush=True)


if __name__ == "__main__":
    main()
