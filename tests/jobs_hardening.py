"""Job functions for the hardening tests: results that fight their unpickling,
jobs that probe what an untrusted job can reach, jobs that leave processes
behind. Module-level, so workers (trusted or not) import them by name."""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import time
from typing import Any

import jobs

# --- results whose unpickling in the supervisor misbehaves ---------------------


def _raise_named(name: str) -> Any:
    raise {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt, "ValueError": ValueError}[name](
        f"unpickling raised {name}"
    )


class RaisesOnUnpickle:
    """Pickles fine; unpickling it raises ``name`` (in whatever process unpickles it)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple[Any, ...]:
        return (_raise_named, (self.name,))


def _released_value(path: str, value: Any) -> Any:
    # Bounded, so that an engine that waits for this unpickling cannot hang a test run forever.
    jobs.wait_signal(path, timeout=30)
    return value


class BlocksOnUnpickle:
    """Unpickling it blocks until something writes to the FIFO ``path`` (at most
    30 s), then gives ``value``."""

    def __init__(self, path: str, value: Any) -> None:
        self.path = path
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        return (_released_value, (self.path, self.value))


def result_raising_on_unpickle(name: str) -> RaisesOnUnpickle:
    return RaisesOnUnpickle(name)


def result_blocking_on_unpickle(path: str, value: Any) -> BlocksOnUnpickle:
    return BlocksOnUnpickle(path, value)


def logged(log: str, tag: str, value: Any) -> Any:
    """Append ``tag`` to ``log`` (one line per run) and return ``value``."""
    with open(log, "a") as f:
        f.write(f"{tag}\n")
    return value


def logged_then_signal(log: str, tag: str, value: Any, path: str) -> Any:
    logged(log, tag, value)
    jobs.signal_test(path)
    return value


def logged_raising_on_unpickle(log: str, tag: str) -> RaisesOnUnpickle:
    logged(log, tag, None)
    return RaisesOnUnpickle("ValueError")


# --- untrusted lanes ---------------------------------------------------------


def int_keys() -> dict[Any, str]:
    return {1: "one"}


def nested_keys() -> dict[str, Any]:
    return {"ok": [{"fine": 1}, {2: "two"}]}


def amplified(n: int) -> list[list[Any]]:
    """A small JSON text that decodes to many objects: n empty lists."""
    return [[] for _ in range(n)]


def spin_ignoring_sigxcpu(seconds: float) -> str:
    """Burn CPU for ``seconds`` while ignoring SIGXCPU."""
    signal.signal(signal.SIGXCPU, signal.SIG_IGN)
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return "spun"


def raise_cpu_limit() -> str:
    """Try to lift this process's CPU limit; say what happened."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (ValueError, OSError) as e:
        return f"refused: {type(e).__name__}"
    return f"raised from {soft}/{hard} to {resource.getrlimit(resource.RLIMIT_CPU)}"


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def poison_alive_pipes() -> int:
    """Write one byte into every pipe this job's worker and the worker's parent
    hold, reopened through ``/proc`` for writing. Returns how many it reached."""
    reached = 0
    worker = os.getppid()
    for pid in (worker, _parent_of(worker)):
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for name in names:
            if name in ("0", "1", "2"):  # the standard streams are the test's, not procq's
                continue
            path = f"/proc/{pid}/fd/{name}"
            try:
                if not os.readlink(path).startswith("pipe:"):
                    continue
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                os.write(fd, b"x")
                reached += 1
            except OSError:
                pass
            finally:
                os.close(fd)
    return reached


def _syscall_errno(number: int, *args: int) -> int:
    """Run a raw system call; 0 if it succeeded, else its errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.syscall(number, *args)
    if result >= 0:
        if number in (_SYS_PIDFD_OPEN, _SYS_PIDFD_GETFD):
            os.close(result)
        return 0
    return ctypes.get_errno()


_SYS_PIDFD_OPEN = 434
_SYS_PIDFD_GETFD = 438
_PTRACE_ATTACH = 16
_PTRACE_DETACH = 17


def _try(what: Any) -> str:
    try:
        what()
    except OSError as e:
        return f"denied: {type(e).__name__} {e.errno}"
    return "allowed"


def _pidfd_getfd(pid: int) -> str:
    """Take any descriptor of ``pid`` with pidfd_getfd: "allowed" if one came."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = libc.syscall(_SYS_PIDFD_OPEN, pid, 0)
    if pidfd < 0:
        return f"denied: pidfd_open errno {ctypes.get_errno()}"
    errors = set()
    try:
        for target in range(3, 64):
            fd = libc.syscall(_SYS_PIDFD_GETFD, pidfd, target, 0)
            if fd >= 0:
                os.close(fd)
                return "allowed"
            errors.add(ctypes.get_errno())
    finally:
        os.close(pidfd)
    return f"denied: errnos {sorted(errors)}"


def _ptrace_attach(pid: int) -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(_PTRACE_ATTACH, pid, 0, 0) != 0:
        return f"denied: errno {ctypes.get_errno()}"
    libc.ptrace(_PTRACE_DETACH, pid, 0, 0)
    return "allowed"


def _read_mem(pid: int) -> None:
    with open(f"/proc/{pid}/maps") as f:
        start = int(f.readline().split("-", 1)[0], 16)
    with open(f"/proc/{pid}/mem", "rb") as f:
        f.seek(start)
        f.read(16)


def _open_fds(pid: int) -> str:
    """Open any of ``pid``'s descriptors through ``/proc/<pid>/fd/<n>``."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        names = [str(n) for n in range(64)]
    errors = set()
    for name in names:
        try:
            os.close(os.open(f"/proc/{pid}/fd/{name}", os.O_RDONLY | os.O_NONBLOCK))
        except OSError as e:
            errors.add(e.errno)
            continue
        return "allowed"
    return f"denied: errnos {sorted(errors)}"


def _fork_from_forkserver(path: str) -> str:
    """Ask the multiprocessing forkserver listening at ``path`` (an attacker
    finds it in ``/proc/net/unix``) to fork a child for this job, a child that
    would hold the server's memory and environment: "allowed" if it forked one."""
    import socket
    from multiprocessing import reduction

    parent_r, child_w = os.pipe()
    child_r, parent_w = os.pipe()
    try:
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(path)
            reduction.sendfds(client, [child_r, child_w, child_r, child_w])
        os.close(child_r)
        os.close(child_w)
        os.close(parent_w)  # a child, if one was forked, reads EOF and exits
        child_r = child_w = parent_w = -1
        # The server writes the child's pid to the write end it was sent; if it
        # refused, nobody holds that end any more.
        return "allowed" if os.read(parent_r, 8) else "denied: refused"
    except OSError as e:
        return f"denied: {type(e).__name__} {e.errno}"
    finally:
        for fd in (parent_r, child_w, child_r, parent_w):
            if fd >= 0:
                os.close(fd)


def probe(targets: dict[str, int], forkserver: str | None = None) -> dict[str, str]:
    """What this job can do to each target process: read its environment, its
    memory, list, open and take its descriptors, trace it; and whether the
    forkserver forks for it."""
    report: dict[str, str] = {"uid": str(os.getuid())}
    targets = {**targets, "own worker": os.getppid()}
    if "trusted worker" in targets:
        targets["forkserver"] = _parent_of(targets["trusted worker"])
    if forkserver is not None:
        report["forkserver fork"] = _fork_from_forkserver(forkserver)
    for name, pid in targets.items():
        report[f"{name} fd open"] = _open_fds(pid)
        report[f"{name} environ"] = _try(lambda pid=pid: open(f"/proc/{pid}/environ", "rb").read())  # noqa: SIM115
        report[f"{name} mem"] = _try(lambda pid=pid: _read_mem(pid))
        report[f"{name} fd list"] = _try(lambda pid=pid: os.listdir(f"/proc/{pid}/fd"))
        report[f"{name} pidfd_getfd"] = _pidfd_getfd(pid)
        report[f"{name} ptrace"] = _ptrace_attach(pid)
    return report


# --- processes a job leaves behind ----------------------------------------------


def start_sleeper(pid_file: str) -> int:
    """Start a plain child (same session) that sleeps, write its pid to
    ``pid_file``, and wait for the supervisor's death without ending."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    tmp = pid_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(child.pid))
    os.replace(tmp, pid_file)
    time.sleep(600)
    return child.pid


def stop_self_after(path: str) -> str:
    """Answer, then stop this worker (SIGSTOP) from a thread once the answer is out."""
    import threading

    def stop() -> None:
        jobs.wait_released(path)
        os.kill(os.getpid(), signal.SIGSTOP)

    threading.Thread(target=stop, daemon=True).start()
    return "answered"


def forked_sharers(n: int, hold: str) -> int:
    """Fork ``n`` children that share this worker's memory and sleep until
    ``hold`` is released; wait for them. Returns n."""
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                jobs.wait_released(hold)
            finally:
                os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    return n


def allocating_children(n: int, mib: int, started: str, hold: str) -> int:
    """Fork ``n`` children that each write ``mib`` MiB of their own memory and
    wait for ``hold``; signal ``started`` once all have written it."""
    pids = []
    ready_r, ready_w = os.pipe()
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                block = bytearray(mib << 20)
                for i in range(0, len(block), 4096):
                    block[i] = 1
                os.write(ready_w, b"1")
                jobs.wait_released(hold)
            finally:
                os._exit(0)
        pids.append(pid)
    got = 0
    while got < n:
        got += len(os.read(ready_r, n))
    jobs.signal_test(started)
    for pid in pids:
        os.waitpid(pid, 0)
    return n


# --- map ---------------------------------------------------------------------------


def first_free_rest_gated(item: int, gate: str, log: str) -> int:
    """Item 0 answers at once; every other item logs its start and waits for ``gate``."""
    if item == 0:
        return 0
    logged(log, f"started {item}", None)
    jobs.wait_released(gate)
    logged(log, f"finished {item}", None)
    return item


def fail_on(item: str) -> str:
    if item.startswith("boom"):
        raise ValueError(f"cannot take {item!r}")
    return item.upper()


# --- what an untrusted job's process holds ---------------------------------------------


class KeyStr(str):
    """A str subclass: JSON writes it as the str it is."""


def result_of_kind(kind: str) -> Any:
    """A result whose dicts have keys of one kind, at some depth."""
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    return {
        "bool": {True: 1},
        "float": {"a": {1.5: "x"}},
        "none": [{None: 1}],
        "tuple": {(1, 2): "pair"},
        "in tuple": ("ok", ({"fine": [1, {3: "three"}]},)),
        "deep": _deep({7: "seven"}, 3000),
        "str subclass": {KeyStr("k"): [1, 2]},
        "deep and fine": _deep({"k": "v"}, 500),
        "cyclic": cyclic,
    }[kind]


def _deep(leaf: Any, depth: int) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def _status_fields() -> dict[str, str]:
    with open("/proc/self/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def privileges() -> dict[str, Any]:
    """This process's capabilities, no_new_privs, dumpability, uid."""
    fields = _status_fields()
    libc = ctypes.CDLL(None, use_errno=True)
    return {
        "caps": {name: int(fields[name], 16) for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")},
        "no_new_privs": int(fields["NoNewPrivs"]),
        "dumpable": libc.prctl(3, 0, 0, 0, 0),  # PR_GET_DUMPABLE
        "uid": os.getuid(),
    }


def dumpable() -> int:
    return int(ctypes.CDLL(None, use_errno=True).prctl(3, 0, 0, 0, 0))


def signals(targets: dict[str, int]) -> dict[str, str]:
    """Whether this job may signal each target (signal 0: a check, nothing sent),
    and a child of its own (which it then ends)."""
    said = {}
    for name, pid in {**targets, "own worker": os.getppid()}.items():
        try:
            os.kill(pid, 0)
            said[name] = "allowed"
        except OSError as e:
            said[name] = f"denied: {e.errno}"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child.kill()
        said["own child"] = "allowed"
    except OSError as e:
        said["own child"] = f"denied: {e.errno}"
    child.wait()
    return said


def handle_sigxcpu_and_spin(seconds: float) -> str:
    """Burn CPU for ``seconds``, catching SIGXCPU and going on."""
    signal.signal(signal.SIGXCPU, lambda *_: None)
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return "spun"


def spin(seconds: float) -> str:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return "spun"


def poke_parent_sentinel(supervisor: int) -> int:
    """(A trusted job.) Write one byte into the pipe whose read end is this
    worker's "parent sentinel", through the supervisor's ``/proc`` entry for
    its write end. Returns how many bytes went in."""
    import multiprocessing

    sentinel = multiprocessing.parent_process().sentinel  # type: ignore[union-attr]
    target = os.readlink(f"/proc/self/fd/{sentinel}")
    written = 0
    for name in os.listdir(f"/proc/{supervisor}/fd"):
        path = f"/proc/{supervisor}/fd/{name}"
        try:
            if os.readlink(path) != target:
                continue
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            written += os.write(fd, b"x")
        except OSError:
            pass
        finally:
            os.close(fd)
    return written
