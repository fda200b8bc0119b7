"""Jobs for test_sandbox: what a job in a sandboxed lane tries to reach, and
what it must still be able to do. Each attempt is reported, never assumed:
``"refused: <error>"`` when the system call failed, ``"reached: ..."`` when
it did what it tried."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

_libc = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWUSER = 0x10000000


def _try(action: Callable[[], Any]) -> str:
    try:
        result = action()
    except OSError as exc:
        return f"refused: {type(exc).__name__}: {exc}"
    return f"reached: {result!r}"[:300]


def _syscall(number: int, *args: Any) -> int:
    result = _libc.syscall(number, *args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return int(result)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read(200)


# --- files ------------------------------------------------------------------------------------


def read_files(paths: list[str]) -> dict[str, str]:
    return {path: _try(lambda p=path: _read(p)) for path in paths}


def _write(path: str, text: str) -> int:
    with open(path, "a") as f:
        return f.write(text)


def change_files(existing: str, directory: str) -> dict[str, str]:
    """Every way of changing ``existing`` (a file) and ``directory`` (holding it)."""
    return {
        "write": _try(lambda: _write(existing, "changed")),
        "truncate": _try(lambda: os.truncate(existing, 0)),
        "create": _try(lambda: _write(os.path.join(directory, "new"), "x")),
        "mkdir": _try(lambda: os.mkdir(os.path.join(directory, "newdir"))),
        "rename": _try(lambda: os.rename(existing, existing + ".moved")),
        "link": _try(lambda: os.link(existing, existing + ".link")),
        "symlink": _try(lambda: os.symlink("/etc/passwd", os.path.join(directory, "sym"))),
        "delete": _try(lambda: os.unlink(existing)),
        "chmod": _try(lambda: os.chmod(existing, 0o777)),
        "utime": _try(lambda: os.utime(existing, (0, 0))),
        "setxattr": _try(lambda: os.setxattr(existing, "user.procq", b"x")),
    }


def use_write_dirs(first: str, second: str) -> dict[str, Any]:
    """What a job may do in its write= directories: create, rename into a
    subdirectory, link, chmod, move between two of them, delete."""
    sub = os.path.join(first, "sub")
    os.makedirs(sub, exist_ok=True)
    with open(os.path.join(first, "a"), "w") as f:
        f.write("a")
    os.replace(os.path.join(first, "a"), os.path.join(sub, "a"))
    os.link(os.path.join(sub, "a"), os.path.join(first, "b"))
    os.chmod(os.path.join(first, "b"), 0o600)
    os.utime(os.path.join(first, "b"), (0, 0))
    shutil.move(os.path.join(first, "b"), os.path.join(second, "b"))
    os.unlink(os.path.join(sub, "a"))
    os.rmdir(sub)
    return {"first": sorted(os.listdir(first)), "second": sorted(os.listdir(second))}


# --- network ----------------------------------------------------------------------------------


def _tcp(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"AWS_SECRET=leaked")
        return "sent"


def _udp(port: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return s.sendto(b"AWS_SECRET=leaked", ("127.0.0.1", port))


def _listen() -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen()
    return int(s.getsockname()[1])


def _unix(address: str | bytes) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(address)
        s.sendall(b"AWS_SECRET=leaked")
        return "sent"


def _raw() -> int:
    return socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).fileno()


def _packet() -> int:
    return socket.socket(socket.AF_PACKET, socket.SOCK_RAW).fileno()


def network(tcp_port: int, udp_port: int, unix_path: str, abstract: bytes) -> dict[str, str]:
    return {
        "tcp connect": _try(lambda: _tcp(tcp_port)),
        "udp send": _try(lambda: _udp(udp_port)),
        "tcp listen": _try(_listen),
        "ipv6": _try(lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).fileno()),
        "raw": _try(_raw),
        "packet": _try(_packet),
        "unix path": _try(lambda: _unix(unix_path)),
        "unix abstract": _try(lambda: _unix(abstract)),
    }


def own_unix_socket() -> str:
    """A UNIX socket pair within the job's own process: allowed."""
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"ping")
        return b.recv(4).decode()


# --- processes and privileges -------------------------------------------------------------------


_PTRACE_ATTACH = 16
_SYS = {"x86_64": {"unshare": 272, "ptrace": 101, "process_vm_readv": 310, "bpf": 321, "perf_event_open": 298,
                   "userfaultfd": 323, "keyctl": 250, "io_uring_setup": 425, "kexec_load": 246,
                   "setns": 308, "init_module": 175},
        "aarch64": {"unshare": 97, "ptrace": 117, "process_vm_readv": 270, "bpf": 280, "perf_event_open": 241,
                    "userfaultfd": 282, "keyctl": 219, "io_uring_setup": 425, "kexec_load": 104,
                    "setns": 268, "init_module": 105}}  # fmt: skip


def _machine() -> dict[str, int]:
    import platform

    return _SYS[platform.machine()]


def _vm_read(pid: int) -> int:
    class IoVec(ctypes.Structure):
        _fields_ = (("base", ctypes.c_void_p), ("len", ctypes.c_size_t))

    buf = ctypes.create_string_buffer(16)
    local = IoVec(ctypes.cast(buf, ctypes.c_void_p), 16)
    remote = IoVec(0x400000, 16)
    return _syscall(_machine()["process_vm_readv"], pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)


def _pid_seen(pid: int) -> str:
    os.kill(pid, 0)
    return "exists"


def processes(supervisor: int) -> dict[str, str]:
    """Reach the supervisor: see it, signal it, trace it, read its memory and environment."""
    listed = [int(name) for name in os.listdir("/proc") if name.isdigit()] if os.path.isdir("/proc") else []
    return {
        "listed": "reached: listed" if supervisor in listed else "refused: not listed",
        "kill 0": _try(lambda: _pid_seen(supervisor)),
        "signal": _try(lambda: os.kill(supervisor, signal.SIGUSR2)),
        "ptrace": _try(lambda: _syscall(_machine()["ptrace"], _PTRACE_ATTACH, supervisor, 0, 0)),
        "mem": _try(lambda: _read(f"/proc/{supervisor}/mem")),
        "environ": _try(lambda: _read(f"/proc/{supervisor}/environ")),
        "vm read": _try(lambda: _vm_read(supervisor)),
        "pidfd": _try(lambda: os.pidfd_open(supervisor)),
    }


def visible_pids() -> list[int]:
    return sorted(int(name) for name in os.listdir("/proc") if name.isdigit())


def privileges() -> dict[str, str]:
    """Gain a privilege: a user namespace (three ways), a mount, and the calls the filter refuses."""
    sys_ = _machine()
    said = {
        "unshare user": _try(lambda: _syscall(sys_["unshare"], _CLONE_NEWUSER)),
        "unshare command": _try(_unshare_command),
        "mount": _try(_mount_tmpfs),
        "setns": _try(lambda: _syscall(sys_["setns"], os.open("/proc/self/ns/net", os.O_RDONLY), 0)),
        "sysctl": _try(_rewrite_sysctl),
    }
    for name in ("bpf", "perf_event_open", "userfaultfd", "keyctl", "io_uring_setup", "kexec_load", "init_module"):
        said[name] = _try(lambda n=name: _syscall(sys_[n], 0, 0, 0, 0, 0))
    return said


def _rewrite_sysctl() -> int:
    """Write a kernel setting its own value back (harmless if it got through)."""
    with open("/proc/sys/kernel/hostname") as f:
        value = f.read()
    with open("/proc/sys/kernel/hostname", "w") as f:
        return f.write(value)


def _unshare_command() -> str:
    done = subprocess.run(["unshare", "-U", "true"], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise PermissionError(done.stderr.strip())
    return "a user namespace"


def _mount_tmpfs() -> int:
    target = tempfile.mkdtemp()
    result = _libc.mount(b"none", target.encode(), b"tmpfs", 0, None)
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


def child_user_namespace() -> str:
    """A fresh interpreter the job starts asks for a user namespace: what the kernel said."""
    code = "import ctypes,os;l=ctypes.CDLL(None,use_errno=True);r=l.unshare(0x10000000);print(r, ctypes.get_errno())"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30).stdout.strip()


# --- what must still work -------------------------------------------------------------------------


def ordinary(marker: str) -> dict[str, Any]:
    """Imports, a program, a fresh interpreter, the private temporary directory."""
    import json
    import lzma
    import sqlite3
    import ssl

    tmp = tempfile.gettempdir()
    path = os.path.join(tmp, "scratch")
    with open(path, "w") as f:
        f.write(marker)
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(b"x")
    con = sqlite3.connect(os.path.join(tmp, "db.sqlite"))
    con.execute("create table t (x)")
    con.close()
    code = "import tempfile, json, sys; print(json.dumps([tempfile.gettempdir(), sys.version_info[0]]))"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return {
        "tmp": tmp,
        "env tmp": os.environ.get("TMPDIR"),
        "listing": sorted(os.listdir(tmp)),
        "true": subprocess.run(["/bin/true"], timeout=30).returncode,
        "child": json.loads(child.stdout) if child.returncode == 0 else child.stderr[-500:],
        "modules": [lzma.__name__, ssl.OPENSSL_VERSION[:7], sqlite3.sqlite_version[:1]],
    }


def temp_exists(path: str) -> dict[str, Any]:
    return {"exists": os.path.exists(path), "tmp": tempfile.gettempdir()}


def child_reads(path: str) -> str:
    """A program the job starts inherits its sandbox."""
    code = f"open({path!r}).read(); print('read')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return "reached" if done.returncode == 0 else "refused: " + done.stderr.strip().splitlines()[-1]


def resolve(name: str) -> list[str]:
    return sorted({info[4][0] for info in socket.getaddrinfo(name, 80, socket.AF_INET)})


def child_connects(port: int) -> str:
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5); print('connected')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return "reached" if done.returncode == 0 else "refused: " + done.stderr.strip().splitlines()[-1]


def leave_child_running() -> int:
    """Start a process that outlives the job (in a session of its own), and return its pid."""
    proc = subprocess.Popen(["/bin/sleep", "600"], start_new_session=True)
    return proc.pid


def crash() -> None:
    os.abort()


def fail(text: str) -> None:
    raise ValueError(text)


def square(x: int) -> int:
    return x * x


def pools(leave: str) -> dict[str, Any]:
    """A thread, a multiprocessing pool and a process pool (semaphores in
    /dev/shm) in the job; leaves a file ``leave`` in /dev/shm; says what
    /dev/shm held when it started."""
    import threading
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    found = sorted(os.listdir("/dev/shm"))
    ran: list[int] = []
    thread = threading.Thread(target=lambda: ran.append(1))
    thread.start()
    thread.join()
    with get_context("fork").Pool(2) as pool:
        mapped = pool.map(abs, [-1, -2])
    with ProcessPoolExecutor(1) as executor:
        executed = list(executor.map(abs, [-3]))
    with open(os.path.join("/dev/shm", leave), "w") as f:
        f.write("left")
    return {"found": found, "thread": ran, "pool": mapped, "executor": executed}
