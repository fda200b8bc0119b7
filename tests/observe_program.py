"""A program with a monitored queue, for the ``procq top`` tests:
``python tests/observe_program.py NAME DIRECTORY``.

It opens ``ProcQueue({"cpu": 2, "io": 1}, name=NAME, monitor=True)``, runs
three jobs and a failing one, then holds job ``"held-job-key"`` running (at
gates in DIRECTORY) and prints a JSON line: its pid and ``q.stats()``. Then
it reads commands on stdin: ``stats`` prints ``q.stats()`` again; ``quit``
lets the job go, closes the queue and prints ``closed``.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import suppress

import jobs

from procq import Job, JobFailed, ProcQueue


def main(name: str, directory: str) -> None:
    started, go = jobs.fifo(directory, "started"), jobs.fifo(directory, "go")
    with ProcQueue({"cpu": 2, "io": 1}, name=name, monitor=True) as q:
        for i in range(3):
            q.push_and_wait(Job(f"done-{i}", jobs.square, args=(i,), lane="cpu"), timeout=20)
        with suppress(JobFailed):
            q.push_and_wait(Job("broken", jobs.boom, args=("it broke",), lane="io"), timeout=20)
        q.push(Job("held-job-key", jobs.signal_and_wait, args=(started, go), lane="cpu"))
        jobs.wait_signal(started)
        print(json.dumps({"pid": os.getpid(), "stats": q.stats().to_dict()}), flush=True)
        for line in sys.stdin:
            if line.strip() == "stats":
                print(json.dumps(q.stats().to_dict()), flush=True)
            elif line.strip() == "quit":
                break
        fd = jobs.release(go)
    os.close(fd)
    print("closed", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
