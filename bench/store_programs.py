"""Several programs sharing one SQLite store, each pushing tiny jobs as fast
as its outcomes come back: ``python -m bench.store --programs 4 --seconds 15``.

Each program (a process of its own, with a queue of 2 workers on the file)
pushes 20 tiny jobs of fresh keys one by one, waits for their outputs, and
starts again, until its time is up. A job's wait runs from the start of its
push to its output in the caller's hands: the time the push took (waiting for
SQLite's write lock, held by the other programs) and the time its outcome took
to be committed and told. What counts is the worst wait of any job in any
program, and the jobs done; and, apart, how long after a job ended its handle
was done (its row committed: a done callback stamps it).

``python -m bench.store_programs PATH SECONDS`` is one program: it says
"ready", starts on a line from its stdin, and prints its figures as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from bench.store_jobs import ended_at, noop
from procq import Job, ProcQueue

#: Jobs a program pushes before it waits for their outputs.
BATCH = 20


def program(path: str, seconds: float) -> dict[str, Any]:
    """One program: push and wait in rounds of ``BATCH`` for ``seconds``; its figures."""
    waits: list[float] = []
    lags: list[float] = []  # a job's end -> its handle done (wall clock, one machine)

    def done(handle: Any) -> None:
        lags.append(time.time() - handle.result(timeout=0))

    with ProcQueue(2, store=path) as q:
        q.push_and_wait(Job(f"warm-{os.getpid()}", noop), timeout=60)
        print("ready", flush=True)
        sys.stdin.readline()
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            pushed = []
            for _ in range(BATCH):
                started = time.monotonic()
                handle = q.push(Job(f"p{os.getpid()}-{n}", ended_at)).handle  # type: ignore[union-attr]
                handle.add_done_callback(done)
                pushed.append((started, handle))
                n += 1
            for started, handle in pushed:
                handle.result(timeout=120)
                waits.append(time.monotonic() - started)
    waits.sort()
    lags.sort()
    return {
        "jobs": len(waits),
        "worst": waits[-1],
        "p99": waits[int(len(waits) * 0.99)],
        "commit_worst": lags[-1],
        "commit_p99": lags[int(len(lags) * 0.99)],
    }


def programs(path: str, n: int, seconds: float) -> dict[str, Any]:
    """``n`` programs on the SQLite file ``path`` at once for ``seconds``: the
    jobs they did, the worst and p99 waits (seconds) of any of them, and the
    worst and p99 times from a job's end to its handle done."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.store_programs", path, str(seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            said = p.stdout.readline()
            if said != "ready\n":
                raise RuntimeError(f"a program did not start (it said {said!r}; its stderr says why)")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        found = []
        for p in procs:
            out, _ = p.communicate(timeout=seconds + 300)
            if p.returncode != 0:
                raise RuntimeError(f"a program failed (exit code {p.returncode}; its stderr says why)")
            found.append(json.loads(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return {
        "jobs": sum(f["jobs"] for f in found),
        "worst": max(f["worst"] for f in found),
        "p99": max(f["p99"] for f in found),
        "commit_worst": max(f["commit_worst"] for f in found),
        "commit_p99": max(f["commit_p99"] for f in found),
        "each": [f["jobs"] for f in found],
    }


if __name__ == "__main__":
    print(json.dumps(program(sys.argv[1], float(sys.argv[2]))), flush=True)
