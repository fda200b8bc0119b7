"""Job functions for test_close_grace: jobs whose process trees outlive a
SIGTERM, so that ending them takes the SIGKILL after the lane's kill_grace.

Workers import this module, so it stays small and imports nothing heavy.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import jobs

# A child that ignores SIGTERM, says so with a line on stdout, then blocks
# until it is killed (on its stdin, which nobody writes to).
_STUBBORN_CHILD = """
import signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
sys.stdout.write("ignoring SIGTERM\\n")
sys.stdout.flush()
sys.stdin.read()
"""

# A child that ignores SIGTERM, lifts the address-space limit it inherited
# from its worker (so that only the supervisor's watch of the tree's memory
# can stop it), says so with a line, then waits for a line on stdin,
# allocates argv[1] MiB, touching every page, and blocks until it is killed.
_STUBBORN_HOG = """
import resource, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
sys.stdout.write("ignoring SIGTERM\\n")
sys.stdout.flush()
sys.stdin.readline()
held = [b"\\x01" * (8 << 20) for _ in range(int(sys.argv[1]) // 8)]
sys.stdin.read()
"""


def _child(code: str, *args: str) -> subprocess.Popen[bytes]:
    """Start ``code`` as a child in this worker's process group; return once it ignores SIGTERM."""
    child = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdout is not None
    child.stdout.readline()
    return child


def stubborn_tree(termed: str, started: str | None = None) -> None:
    """Spin, with a child, both ignoring SIGTERM: only a SIGKILL ends them.

    Reports ``"<worker pid> <child pid>"`` on the FIFO ``started`` (if given)
    once both ignore SIGTERM, and the same on ``termed`` when the first
    SIGTERM reaches the job (from then on the tree is in its grace)."""
    pids = [os.getpid()]

    def on_term(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        jobs.signal_test(termed, " ".join(map(str, pids)).encode())

    signal.signal(signal.SIGTERM, on_term)
    pids.append(_child(_STUBBORN_CHILD).pid)
    if started is not None:
        jobs.signal_test(started, " ".join(map(str, pids)).encode())
    while True:
        pass


def stubborn_hog(started: str, mib: int) -> None:
    """Ignore SIGTERM, with a child that does too; report ``"<worker pid>
    <child pid>"`` on the FIFO ``started``, then let the child use ``mib``
    MiB, and block."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    hog = _child(_STUBBORN_HOG, str(mib))
    jobs.signal_test(started, f"{os.getpid()} {hog.pid}".encode())
    assert hog.stdin is not None
    hog.stdin.write(b"allocate\n")
    hog.stdin.flush()
    jobs.block_forever()
