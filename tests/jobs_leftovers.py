"""Jobs that leave processes behind in odd states, for the supervisor-death
and stopped-worker tests. Module-level, so workers (trusted or not) import
them by name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import jobs

_SLEEPER = "import time; time.sleep(600)"
# A child that starts a grandchild (same group) and prints its pid.
_PARENT = (
    "import subprocess, sys, time; "
    f"g = subprocess.Popen([sys.executable, '-c', {_SLEEPER!r}]); "
    "print(g.pid, flush=True); time.sleep(600)"
)


def start_tree(pid_file: str) -> int:
    """Leave a grandchild, a child and a stopped child (all in this job's
    process group), write their pids to ``pid_file``, and wait without end."""
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    grandchild = int(parent.stdout.readline())
    stopped = subprocess.Popen([sys.executable, "-c", _SLEEPER])
    os.kill(stopped.pid, signal.SIGSTOP)
    tmp = pid_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(" ".join(str(p) for p in (parent.pid, grandchild, stopped.pid)))
    os.replace(tmp, pid_file)
    time.sleep(600)
    return 0


def linger_after(path: str) -> int:
    """Answer, leaving a non-daemon thread that waits for ``path``: the
    worker does not exit at EOF on its pipe until it is released."""
    threading.Thread(target=jobs.wait_released, args=(path,), daemon=False).start()
    return os.getpid()
