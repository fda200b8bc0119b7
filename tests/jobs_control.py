"""Job functions for the job-control tests: timeouts, SIGTERM, process trees, memory, recycling,
the worker's environment.

Workers import this module (under both start methods), so it stays small and
imports nothing heavy at module level.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Any

import jobs

#: Memory a job keeps alive in its worker after it returns (see ``hoard``).
_HOARD: list[bytearray] = []

# A process that blocks until the FIFO (or file) argv[1] gives it a byte: only
# a kill ends it while the test never releases that gate.
_BLOCK = "import sys; open(sys.argv[1], 'rb').read(1)"

# A process that lifts the address-space limit it inherited from its worker
# (so that only the supervisor's resident-memory watch can stop it), then waits
# for one line on stdin and allocates, touching every page, up to argv[1] MiB
# in 8 MiB steps, then blocks on stdin forever.
_HOG = """
import resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
sys.stdin.readline()
held = []
for _ in range(int(sys.argv[1]) // 8):
    held.append(b"\\x01" * (8 << 20))
sys.stdin.read()
"""


def write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def touch_then(path: str, value: Any = "ran") -> Any:
    """Create ``path`` (proof the job ran), return ``value``."""
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    return value


def ignore_sigterm_then_block(ready: str) -> None:
    """Ignore SIGTERM, say so in the file ``ready``, block until killed."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    write_atomic(ready, str(os.getpid()))
    jobs.block_forever()


def handle_sigterm_then_block(started: str, cleaned: str) -> None:
    """On SIGTERM write ``cleaned`` and die of SIGTERM; report the pid on the
    FIFO ``started`` once the handler is in place, then block."""

    def on_term(signum: int, frame: Any) -> None:
        write_atomic(cleaned, f"cleaned up {os.getpid()}")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    jobs.signal_test(started, str(os.getpid()).encode())
    jobs.block_forever()


def _spawn(code: str, *args: str, new_session: bool = False, **kwargs: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code, *args], start_new_session=new_session, **kwargs)


def tree_then_block(gate: str, report: str | None = None, started: str | None = None, own_session: bool = True) -> None:
    """Start a child in this worker's process group and (``own_session``) one
    in a session of its own, both blocked on ``gate``; then report
    ``"<worker pid> <child pid> [<other child pid>]"`` (atomically to the file
    ``report`` and/or on the FIFO ``started``) and block on ``gate`` too."""
    kids = [_spawn(_BLOCK, gate)]
    if own_session:
        kids.append(_spawn(_BLOCK, gate, new_session=True))
    text = " ".join(str(p) for p in [os.getpid(), *(k.pid for k in kids)])
    if report is not None:
        write_atomic(report, text)
    if started is not None:
        jobs.signal_test(started, text.encode())
    jobs.wait_released(gate)


def tree_then_hog(gate: str, report: str, hog_mib: int) -> None:
    """Start two blocked children (one in its own session) and a memory hog
    child, report all pids to ``report``, then let the hog grow; block on ``gate``."""
    kids = [_spawn(_BLOCK, gate), _spawn(_BLOCK, gate, new_session=True)]
    hog = _spawn(_HOG, str(hog_mib), stdin=subprocess.PIPE)
    write_atomic(report, " ".join(str(p) for p in [os.getpid(), *(k.pid for k in kids), hog.pid]))
    assert hog.stdin is not None
    hog.stdin.write(b"go\n")
    hog.stdin.flush()
    jobs.wait_released(gate)


def allocate(mib: int) -> int:
    """Allocate (and touch) ``mib`` MiB; return how many bytes were held."""
    block = bytearray(mib << 20)
    return len(block)


def allocate_for(mib: int, seconds: float) -> int:
    """Allocate (and touch) ``mib`` MiB and hold it ``seconds`` (long enough
    for the supervisor's memory samples to see it); return how many bytes."""
    block = bytearray(mib << 20)
    time.sleep(seconds)
    return len(block)


def raise_memory_error(text: str) -> None:
    raise MemoryError(text)


def hoard(mib: int) -> int:
    """Keep ``mib`` MiB alive in this worker (module-level), touched; return the pid."""
    _HOARD.append(bytearray(b"\x01") * (mib << 20))
    return os.getpid()


def environ() -> dict[str, str]:
    return dict(os.environ)


def getcwd() -> str:
    return os.getcwd()


def open_fds() -> dict[str, str]:
    """This process's open descriptors (as str, a JSON key) and what each
    refers to. (Read link by link, not by listing /proc/self/fd, which needs a
    descriptor of its own: the job may run under a tight ``nofile`` limit.)"""
    fds = {}
    for fd in range(1024):
        with contextlib.suppress(OSError):
            fds[str(fd)] = os.readlink(f"/proc/self/fd/{fd}")
    return fds
