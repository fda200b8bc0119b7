"""A sandboxed lane's kernel mechanics (Linux): namespaces, the job's view
of the filesystem, Landlock rules and the seccomp filter.

Once per worker (``isolate``, before it drops its privileges): the worker
enters new user, mount, PID, IPC, UTS and (without network) network namespaces,
as bubblewrap does, with no privilege on the host: its uid and gid map to
themselves. The process the supervisor started stays outside, waits for
the worker and ends as it ends (``_mirror``). The worker is PID 1 of its PID
namespace: a job sees only its own processes, and when the worker dies the
kernel kills every process left in it. The worker then builds the view the
jobs see and makes it their root (``pivot_root``): a tmpfs that holds only
the allowed paths, bound read-only (or read-write for ``write=``), a few
devices, a read-only ``/proc`` of the PID namespace, and a private ``/tmp``
and ``/dev/shm``. Every
other file of the host, a UNIX socket's path among them, does not exist
there; a read-only mount also refuses what Landlock does not cover
(``chmod``, ``chown``, ``utime``, extended attributes).

Per job (``confine``, in the job's process, before job code runs): a
Landlock domain of its own that allows the same paths (and the job's own
temporary directory), no TCP (ABI 4), no signal or abstract UNIX socket
outside the domain (ABI 6); then the seccomp filter (``_system.seccomp``).

Everything is plain system calls through ``ctypes``. ``probe_main`` is the
probe the supervisor runs (``_model.sandbox.kernel``): the same calls, in a
process of their own, so the queue knows before it starts a worker what
this kernel refuses.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import select
import signal
import stat
import sys
from typing import Any, NamedTuple, NoReturn

from procq._system import seccomp as _seccomp
from procq._system.privileges import landlock_abi, libc, set_dumpable

__all__ = ["SHM", "Admission", "confine", "default_reads", "isolate", "probe_main", "reap_leftovers"]

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
_MNT_DETACH = 2
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 1, 2, 4
_AT_RECURSIVE = 0x8000
_SYS_MOUNT_SETATTR = 442
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}

_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2
# Filesystem rights, by the ABI that brought them: 13 in ABI 1, REFER in 2,
# TRUNCATE in 3, IOCTL_DEV in 5.
_FS_ALL = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1, 2, 4, 8
_TRUNCATE, _IOCTL_DEV = 1 << 14, 1 << 15
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV
_NET_BIND_TCP, _NET_CONNECT_TCP = 1, 2
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1, 2

#: What every sandboxed job may read besides the interpreter and its import
#: path: system libraries and programs, the dynamic loader's cache, the time zone.
_SYSTEM_READS = (
    "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc/ld.so.cache", "/etc/ld.so.conf",
    "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives",
)  # fmt: skip
#: What a job with the network also reads: name resolution and certificates.
_NETWORK_READS = (
    "/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/gai.conf", "/etc/host.conf", "/etc/services",
    "/etc/ssl", "/etc/pki", "/etc/ca-certificates",
)  # fmt: skip
#: Devices a job may read and write.
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
#: Where the view is built in the worker's mount namespace (hidden from the host by it).
_BUILD = "/tmp"
#: Where a job's POSIX shared memory lives: a tmpfs of its worker's in the view.
SHM = "/dev/shm"
#: Never bound from the host for a job to read: the root, and the view's own mounts.
_NEVER_READ = ("/", "/tmp", SHM, "/proc")


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


# --- what a job may reach -------------------------------------------------------------------


def default_reads(import_path: list[str], network: bool = False) -> list[str]:
    """The paths every sandboxed job may read: the interpreter's prefixes,
    the import path's directories (never ``/``, nor the view's own ``/tmp``,
    ``/dev/shm`` and ``/proc``: a read-only copy of the host's would hide the
    job's private one, as a script run from ``/tmp`` puts ``/tmp`` on the
    path), system libraries; with the network, name resolution's files and
    certificates."""
    paths = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, os.path.realpath(sys.executable)]
    paths += [p for p in import_path if os.path.isdir(p) and os.path.realpath(p) not in _NEVER_READ]
    paths += _SYSTEM_READS + (_NETWORK_READS if network else ())
    return _existing(paths)


def _existing(paths: list[str]) -> list[str]:
    seen: list[str] = []
    for p in paths:
        if p not in seen and os.path.lexists(p):
            seen.append(p)
    return seen


# --- once per worker: namespaces and the view -------------------------------------------------


class Admission:
    """The worker's leave, asked of the process outside before each job
    (``admit``). The supervisor knows the worker as that process: once it
    is killed, the worker must start no job, although it lives on until the
    kernel has torn that process down (the worker's death signal comes at
    the end of it). A job started in that window would be blamed for a death
    that came before it. A killed process answers nothing: EOF."""

    def __init__(self, ask: int, answer: int) -> None:
        self._ask = ask
        self._answer = answer

    def admit(self) -> bool:
        """May the worker start its next job? False: the process outside is gone."""
        try:
            os.write(self._ask, b"?")
            return os.read(self._answer, 1) == b"+"
        except OSError:
            return False


def isolate(
    reads: list[str], writes: list[str], network: bool, cwd: str | None, keep: set[int], tmp_size: int | None = None
) -> Admission:
    """Enter the worker's namespaces and make the view its root. Returns in
    the worker, now PID 1 of its PID namespace; the process that called it
    stays outside and never returns (``_mirror``). Raises ``OSError``
    naming the step the kernel refused. ``keep``: the descriptors the
    process outside closes (the worker's pipes). ``tmp_size``: the bytes
    the jobs' private /tmp and /dev/shm may each hold (tmpfs ``size=``;
    None: the kernel's default, half the RAM)."""
    plan = _plan(reads, writes)
    flags = _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS
    flags |= 0 if network else _CLONE_NEWNET
    uid, gid = os.geteuid(), os.getegid()
    _check(libc().unshare(flags), "unshare (new user, mount, PID, IPC, UTS and network namespaces)")
    _map_ids(uid, gid)
    ask_r, ask_w = os.pipe()
    answer_r, answer_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(ask_w)
        os.close(answer_r)
        _mirror(pid, keep, ask_r, answer_w)
    os.close(ask_r)
    os.close(answer_w)
    gate = Admission(ask_w, answer_r)
    _build(plan, tmp_size)
    visible = cwd is not None and any(_under(os.path.realpath(cwd), os.path.realpath(p)) for p in reads + writes)
    os.chdir(cwd if visible and cwd else "/")
    return gate


def _map_ids(uid: int, gid: int) -> None:
    # A process that is not dumpable has /proc/self owned by root: open its maps while dumpable.
    set_dumpable(True)
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1\n"), ("gid_map", f"{gid} {gid} 1\n")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    finally:
        set_dumpable(False)


def _mirror(pid: int, keep: set[int], ask: int, answer: int) -> NoReturn:
    """The process outside the namespaces: answer the worker's ``Admission``
    until it exits, then end as it ended. A SIGTERM for the worker's process
    group reaches the worker too; this process ignores it and waits."""
    for fd in keep:
        with contextlib.suppress(OSError):
            os.close(fd)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exited = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(exited, select.POLLIN)
    poller.register(ask, select.POLLIN)
    done = False
    while not done:
        for fd, _ in poller.poll():
            if fd == exited:
                done = True
            elif os.read(ask, 64):
                os.write(answer, b"+")
            else:  # the worker closed its end: only its exit is left to wait for
                poller.unregister(ask)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


class _Step(NamedTuple):
    """One step of building the view: bind ``path`` ("read", "write" or
    "dev") at the same place in the view, or ("link") make it a symlink to ``link``."""

    kind: str
    path: str
    link: str = ""


def _plan(reads: list[str], writes: list[str]) -> list[_Step]:
    """The steps that build the view, parents first. Read on the host before
    the build hides its /tmp: each path's real place, and the symlinks on
    the way to it (``/bin`` -> ``usr/bin``), made again in the view."""
    plan: list[_Step] = []
    links: dict[str, str] = {}
    wanted = [("write", p) for p in writes] + [("read", p) for p in reads] + [("dev", p) for p in _DEVICES]
    for kind, path in wanted:
        if not os.path.lexists(path):
            continue
        prefix = ""
        for part in path.strip("/").split("/"):
            prefix += "/" + part
            if os.path.islink(prefix) and prefix not in links:
                links[prefix] = os.readlink(prefix)
        real = os.path.realpath(path)
        if all(real != step.path for step in plan):
            plan.append(_Step(kind, real))
    plan.sort(key=_depth)
    kept: list[_Step] = []
    for step in plan:
        covers = ("write",) if step.kind == "write" else ("read", "write")
        if not any(k.kind in covers and _under(step.path, k.path) for k in kept):  # else: in the view already
            kept.append(step)
    kept += [_Step("link", p, t) for p, t in links.items()]
    return sorted(kept, key=_depth)


def _depth(step: _Step) -> tuple[int, str]:
    return step.path.count("/"), step.path


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [s.encode() if s is not None else None for s in (source, target, fstype, data)]
    _check(libc().mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {source or ''} on {target}")


def _setattr(path: str, attrs: int, recursive: bool) -> None:
    attr = (ctypes.c_uint64 * 4)(attrs, 0, 0, 0)
    result = libc().syscall(
        _SYS_MOUNT_SETATTR, -100, path.encode(), ctypes.c_uint(_AT_RECURSIVE if recursive else 0),
        ctypes.byref(attr), ctypes.c_size_t(32),
    )  # fmt: skip
    _check(result, f"mount_setattr on {path}")


def _build(plan: list[_Step], tmp_size: int | None) -> None:
    """In the worker (PID 1 of its namespace): build the view on a tmpfs and
    make it the root. Nothing mounted here is seen outside the namespace."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    # Descriptors of the paths to bind, opened in this mount namespace (a bind
    # from another one is refused) and before the tmpfs below hides the host's /tmp.
    fds = {step.path: os.open(step.path, os.O_PATH | os.O_CLOEXEC) for step in plan if step.kind != "link"}
    root = _BUILD
    _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=4m")
    os.mkdir(root + "/tmp", 0o755)
    # Past its size a write fails with ENOSPC; its pages count as the memory of the job that wrote them.
    size = "" if tmp_size is None else f",size={tmp_size}"
    _mount("tmpfs", root + "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=0755{size}")
    # A private /dev/shm: POSIX shared memory and semaphores (multiprocessing's locks) work in a job.
    os.makedirs(root + SHM, 0o755)
    _mount("tmpfs", root + SHM, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=1777{size}")
    os.mkdir(root + "/proc", 0o555)
    _mount("proc", root + "/proc", "proc", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    for kind, real, link in plan:
        target = root + real
        if kind == "link":
            if not os.path.lexists(target):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.symlink(link, target)
            continue
        fd = fds[real]
        if stat.S_ISDIR(os.stat(fd).st_mode):
            os.makedirs(target, exist_ok=True)
        elif not os.path.lexists(target):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        _mount(f"/proc/self/fd/{fd}", target, None, _MS_BIND | _MS_REC)
        os.close(fd)
        attrs = {"read": _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV, "write": _MOUNT_ATTR_NOSUID}
        _setattr(target, attrs.get(kind, _MOUNT_ATTR_NOSUID) | (0 if kind == "dev" else _MOUNT_ATTR_NODEV), True)
    _setattr(root, _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV, False)
    os.chdir(root)
    _check(libc().syscall(_SYS_PIVOT_ROOT[platform.machine()], b".", b"."), "pivot_root")
    _check(libc().umount2(b".", _MNT_DETACH), "umount2 of the old root")
    os.chdir("/")


def reap_leftovers() -> None:
    """In the worker (PID 1 of its PID namespace), after a job's process
    exited: kill every process that job left behind, and reap them."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:  # pragma: no cover - PEP 475 retries
            continue


# --- once per job: Landlock and seccomp ----------------------------------------------------------


def confine(
    abi: int, reads: list[str], writes: list[str], proc: bool, network: bool, filt: bytes | None,
    connect: tuple[int, ...] = (),
) -> None:  # fmt: skip
    """The job's process, before job code runs: a Landlock domain that allows
    reading ``reads`` (and ``/proc`` if ``proc``), everything in ``writes``,
    no TCP unless ``network`` (but connecting to the ports ``connect``), no
    signal or abstract UNIX socket outside it; then the seccomp filter
    ``filt``. Raises ``OSError`` if the kernel refuses."""
    if abi >= 1:
        _landlock(abi, reads + (["/proc"] if proc else []), writes, network, connect)
    if filt is not None:
        _seccomp.install(filt)


def _landlock(abi: int, reads: list[str], writes: list[str], network: bool, connect: tuple[int, ...] = ()) -> None:
    fs = _FS_ALL[max(k for k in _FS_ALL if k <= abi)]
    net = 0 if network or abi < 4 else _NET_BIND_TCP | _NET_CONNECT_TCP
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
    attr = (ctypes.c_uint64 * 3)(fs, net, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    lib = libc()
    fd = _check(lib.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0), "landlock")
    try:
        read = _EXECUTE | _READ_FILE | _READ_DIR
        rules = [(p, read) for p in reads] + [(p, fs) for p in writes]
        rules += [(p, _READ_FILE | _WRITE_FILE | (fs & _IOCTL_DEV)) for p in _DEVICES]
        for path, rights in rules:
            try:
                parent = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # not there: nothing to allow
            try:
                if not stat.S_ISDIR(os.fstat(parent).st_mode):
                    rights &= _FILE_RIGHTS
                rule = ctypes.create_string_buffer(
                    rights.to_bytes(8, sys.byteorder) + parent.to_bytes(4, sys.byteorder, signed=True), 12
                )
                _check(lib.syscall(_SYS_LANDLOCK_ADD_RULE, fd, _RULE_PATH_BENEATH, rule, 0), f"landlock rule {path}")
            finally:
                os.close(parent)
        for port in connect if net else ():
            rule = ctypes.create_string_buffer(
                _NET_CONNECT_TCP.to_bytes(8, sys.byteorder) + port.to_bytes(8, sys.byteorder), 16
            )
            _check(lib.syscall(_SYS_LANDLOCK_ADD_RULE, fd, _RULE_NET_PORT, rule, 0), f"landlock rule TCP port {port}")
        _check(lib.prctl(38, 1, 0, 0, 0), "no_new_privs")
        _check(lib.syscall(_SYS_LANDLOCK_RESTRICT_SELF, fd, 0), "landlock_restrict_self")
    finally:
        os.close(fd)


# --- the probe ---------------------------------------------------------------------------------


def probe_main() -> None:
    """Run by the supervisor as ``python -I -c``: what this kernel gives an
    unprivileged sandbox, as JSON on stdout: the Landlock ABI, whether a
    seccomp filter loads, and whether the namespaces and the view can be
    made (else the step the kernel refused and its errno)."""
    report: dict[str, Any] = {"landlock": landlock_abi(), "seccomp": None, "namespaces": None}
    if not _seccomp.supported():
        report["seccomp"] = [0, f"no system call table for this machine ({platform.machine()})"]
    report["namespaces"] = _probe_namespaces()
    if report["seccomp"] is None:
        try:
            libc().prctl(38, 1, 0, 0, 0)
            _seccomp.install(_seccomp.program(False))
        except OSError as exc:
            report["seccomp"] = [exc.errno or 0, str(exc)]
    print(json.dumps(report))


def _probe_namespaces() -> list[Any] | None:
    """None if the worker's namespaces and view can be made here; else
    [errno, what the kernel refused]."""
    read, write = os.pipe()
    try:
        pid = os.fork()
    except OSError as exc:
        return [exc.errno or 0, str(exc)]
    if pid == 0:  # pragma: no cover - the probe's child
        os.close(read)
        said: list[Any] | None = None
        try:
            isolate([], [], False, None, set())
        except OSError as exc:
            said = [exc.errno or 0, exc.strerror or str(exc)]
        except BaseException as exc:
            said = [0, repr(exc)]
        os.write(write, json.dumps(said).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    try:
        result: list[Any] | None = json.loads(data) if data else [0, "the probe's process died"]
    except ValueError:
        result = [0, f"the probe said {data[:200]!r}"]
    return result


if __name__ == "__main__":  # pragma: no cover
    probe_main()
    sys.exit(0)
