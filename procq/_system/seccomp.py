"""A sandboxed job's seccomp filter, assembled by hand (no libseccomp).

The filter is a classic BPF program the kernel runs on every system call of
the job's process and of every process it starts (a filter is inherited
across ``fork`` and ``execve``, and cannot be removed). It answers:

- a system call made through another ABI than this process's own (32-bit
  ``int 0x80`` on x86-64, the x32 ABI): the process is killed. Those tables
  number calls differently, so a filter written for one ABI means nothing
  for another; refusing them is what container runtimes do.
- the calls that gain or change privileges, reach other processes or the
  kernel's rarely used, often exploited surfaces: ``EPERM``. Namespaces
  (``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*`` flag), mounts (the
  old and the new mount API, ``pivot_root``, ``chroot``), ``ptrace`` and
  ``process_vm_readv``/``writev``, ``bpf``, ``perf_event_open``,
  ``userfaultfd``, keyrings, ``kexec``, modules, ``io_uring`` (it makes
  sockets and opens files without the system calls filtered here),
  ``open_by_handle_at``, ``fanotify``, and writing to a terminal's input
  (``ioctl(TIOCSTI)``, ``TIOCLINUX``).
- ``clone3``: ``ENOSYS``. Its flags are in a struct that a filter cannot
  read, so no filter can tell a namespace from a thread; libc then falls
  back to ``clone``, whose flags are checked.
- without network: ``socket`` and ``socketpair`` of any family but
  ``AF_UNIX``: ``EPERM``.

Only x86-64 and aarch64 have a table here; elsewhere ``supported()`` is
False and the sandbox says so.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

__all__ = ["install", "program", "supported"]

# BPF opcodes (linux/bpf_common.h) and seccomp return values (linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JSET_K = 0x45
_JGE_K = 0x35
_RET_K = 0x06
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
# Offsets in struct seccomp_data: nr, arch, then the 64-bit arguments.
_NR, _ARCH = 0, 4


def _arg_low(n: int) -> int:
    """The offset of argument ``n``'s low 32 bits (little-endian machines)."""
    return 16 + 8 * n


_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_X32_BIT = 0x40000000
_AF_UNIX = 1
_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C
_CLONE_NEW = 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00020000 | 0x80

# The calls refused with EPERM, by name; each table below gives their numbers.
_REFUSED = (
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr", "ptrace", "process_vm_readv", "process_vm_writev", "bpf",
    "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "open_by_handle_at", "name_to_handle_at", "fanotify_init", "reboot", "swapon", "swapoff", "acct",
    "quotactl", "syslog", "iopl", "ioperm", "modify_ldt", "vhangup", "settimeofday", "clock_settime",
    "adjtimex", "lookup_dcookie",
)  # fmt: skip

# (audit arch, {name: number}) per machine; names absent from a table do not exist there.
_COMMON_NEW = {
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "kexec_file_load": None, "clone3": 435,
}  # fmt: skip
_TABLES: dict[str, tuple[int, dict[str, int | None]]] = {
    "x86_64": (
        0xC000003E,
        {
            **_COMMON_NEW,
            "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
            "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "bpf": 321,
            "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248, "request_key": 249,
            "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
            "delete_module": 176, "open_by_handle_at": 304, "name_to_handle_at": 303, "fanotify_init": 300,
            "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163, "quotactl": 179, "syslog": 103,
            "iopl": 172, "ioperm": 173, "modify_ldt": 154, "vhangup": 153, "settimeofday": 164,
            "clock_settime": 227, "adjtimex": 159, "lookup_dcookie": 212,
            "clone": 56, "socket": 41, "socketpair": 53, "ioctl": 16,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            **_COMMON_NEW,
            "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
            "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "bpf": 280,
            "perf_event_open": 241, "userfaultfd": 282, "keyctl": 219, "add_key": 217, "request_key": 218,
            "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273,
            "delete_module": 106, "open_by_handle_at": 265, "name_to_handle_at": 264, "fanotify_init": 262,
            "reboot": 142, "swapon": 224, "swapoff": 225, "acct": 89, "quotactl": 60, "syslog": 116,
            "vhangup": 58, "settimeofday": 170, "clock_settime": 112, "adjtimex": 171, "lookup_dcookie": 18,
            "clone": 220, "socket": 198, "socketpair": 199, "ioctl": 29,
        },
    ),
}  # fmt: skip


def supported() -> bool:
    """Is there a system call table for this machine?"""
    return platform.machine() in _TABLES


class _Program:
    """Instructions with symbolic jump targets, resolved when assembled."""

    def __init__(self) -> None:
        self.code: list[tuple[int, int | str, int | str, int]] = []
        self.labels: dict[str, int] = {}

    def op(self, code: int, k: int, jt: int | str = 0, jf: int | str = 0) -> None:
        self.code.append((code, jt, jf, k))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def assemble(self) -> bytes:
        out = []
        for i, (code, jt, jf, k) in enumerate(self.code):
            offsets = [self.labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf)]
            if any(not 0 <= o < 256 for o in offsets):  # pragma: no cover - the program is small
                raise ValueError("a seccomp jump out of range")
            out.append(struct.pack("=HBBI", code, offsets[0], offsets[1], k & 0xFFFFFFFF))
        return b"".join(out)


def program(network: bool) -> bytes:
    """The filter for this machine: ``network`` False also refuses every
    socket family but ``AF_UNIX``."""
    arch, table = _TABLES[platform.machine()]
    p = _Program()
    p.op(_LD_W_ABS, _ARCH)
    p.op(_JEQ_K, arch, 1, 0)
    p.op(_RET_K, _RET_KILL_PROCESS)
    p.op(_LD_W_ABS, _NR)
    if arch == _TABLES["x86_64"][0]:
        p.op(_JGE_K, _X32_BIT, "kill", 0)
    for name in _REFUSED:
        number = table.get(name)
        if number is not None:
            p.op(_JEQ_K, number, "eperm", 0)
    p.op(_JEQ_K, table["clone3"] or 0, "enosys", 0)
    p.op(_JEQ_K, table["clone"] or 0, "clone", 0)
    p.op(_JEQ_K, table["ioctl"] or 0, "ioctl", 0)
    if not network:
        p.op(_JEQ_K, table["socket"] or 0, "socket", 0)
        p.op(_JEQ_K, table["socketpair"] or 0, "socket", 0)
    p.op(_RET_K, _RET_ALLOW)
    p.label("clone")  # clone(flags, ...) on both machines: flags first
    p.op(_LD_W_ABS, _arg_low(0))
    p.op(_JSET_K, _CLONE_NEW, "eperm", "allow")
    p.label("ioctl")
    p.op(_LD_W_ABS, _arg_low(1))
    p.op(_JEQ_K, _TIOCSTI, "eperm", 0)
    p.op(_JEQ_K, _TIOCLINUX, "eperm", "allow")
    if not network:
        p.label("socket")
        p.op(_LD_W_ABS, _arg_low(0))
        p.op(_JEQ_K, _AF_UNIX, "allow", "eperm")
    p.label("allow")
    p.op(_RET_K, _RET_ALLOW)
    p.label("eperm")
    p.op(_RET_K, _RET_ERRNO | errno.EPERM)
    p.label("enosys")
    p.op(_RET_K, _RET_ERRNO | errno.ENOSYS)
    p.label("kill")
    p.op(_RET_K, _RET_KILL_PROCESS)
    return p.assemble()


_libc = ctypes.CDLL(None, use_errno=True)


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_char_p))


def install(code: bytes) -> None:
    """Load ``code`` (from ``program``) as this process's seccomp filter.
    Needs ``no_new_privs`` (or CAP_SYS_ADMIN); raises ``OSError`` if refused."""
    prog = _SockFprog(len(code) // 8, code)
    if _libc.prctl(_PR_SET_SECCOMP, ctypes.c_ulong(_SECCOMP_MODE_FILTER), ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp could not load the sandbox's filter")
