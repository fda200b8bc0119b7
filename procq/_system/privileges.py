"""What a process lets others do to it, and what it may do itself (Linux).

- ``set_dumpable(False)``: a process that is not "dumpable" cannot be traced,
  have its ``/proc`` entries (memory, environment, descriptors) read, or its
  descriptors taken with ``pidfd_getfd``, by a process of the same user that
  lacks ``CAP_SYS_PTRACE``. Forked children inherit it; ``execve`` resets it.
  It also means no core dump.
- ``drop_privileges()``: an untrusted worker, before it forks any job: no
  capability left (bounding set, ambient, effective, permitted, inheritable)
  and ``no_new_privs`` (no exec can give any back: not a set-uid program, not
  file capabilities, not root's own exec rule).
- ``confine_job()``: a job's process, before it runs job code: a Landlock
  domain of its own (where the kernel has Landlock). The kernel then refuses
  it every ``ptrace``-class access (tracing, ``/proc/<pid>/mem``, ``environ``,
  ``fd``, ``pidfd_getfd``) to any process outside that domain, whatever their
  dumpability, and, from Landlock ABI 6 (Linux 6.12), every signal to them.
- ``make_untraceable()`` / ``untraceable()``: the supervisor's process-wide
  latch, set when a queue with an untrusted lane opens.

Everything here is plain system calls through ``ctypes`` on libc, with
nothing to import that a worker does not already have; elsewhere than Linux
each is a no-op.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

__all__ = [
    "confine_job",
    "drop_privileges",
    "landlock_abi",
    "libc",
    "make_untraceable",
    "set_dumpable",
    "set_pdeathsig",
    "untraceable",
]

_LINUX = sys.platform.startswith("linux")

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_GET_NO_NEW_PRIVS = 39
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_VERSION_3 = 0x20080522

# Landlock: its system calls have the same numbers on every architecture.
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
# Access rights a domain must handle to exist before ABI 6: making character
# and block devices, which a process without CAP_MKNOD cannot do anyway.
_LANDLOCK_ACCESS_FS_MAKE_CHAR = 1 << 6
_LANDLOCK_ACCESS_FS_MAKE_BLOCK = 1 << 11
# Reparenting a file (rename or link across directories), from ABI 2. A domain
# that does not handle it refuses every reparenting (EXDEV): it must handle it,
# and allow it everywhere.
_LANDLOCK_ACCESS_FS_REFER = 1 << 13
_LANDLOCK_RULE_PATH_BENEATH = 1
_LANDLOCK_SCOPE_SIGNAL = 1 << 1

_libc: Any = None


def libc() -> Any:
    """The C library, loaded once, with errno kept (``ctypes.get_errno``)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _prctl(option: int, arg2: int = 0) -> int:
    result: int = libc().prctl(option, ctypes.c_ulong(arg2), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    return result


def set_dumpable(on: bool) -> None:
    if _LINUX:
        _prctl(_PR_SET_DUMPABLE, int(on))


def set_pdeathsig() -> None:
    """Have the kernel SIGKILL this process when its parent dies."""
    if _LINUX:
        _prctl(_PR_SET_PDEATHSIG, 9)  # SIGKILL


# --- the supervisor's latch ------------------------------------------------------

_untraceable = False


def make_untraceable() -> None:
    """Make this process, from now on, not dumpable, and have every trusted
    worker started from now on by any queue of this process stay so. Never
    undone: a process that ever ran untrusted jobs stays closed to them."""
    global _untraceable
    set_dumpable(False)
    _untraceable = True


def untraceable() -> bool:
    return _untraceable


# --- capabilities -----------------------------------------------------------------


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32))


def _capabilities() -> tuple[Any, Any]:
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc().capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget failed")
    return header, data


def _last_capability() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):  # pragma: no cover - no /proc
        return 63


def drop_privileges() -> None:
    """Drop every capability this process has and set ``no_new_privs``;
    raises ``OSError`` if it still has any capability afterwards."""
    if not _LINUX:
        return
    header, data = _capabilities()
    if any(d.permitted or d.effective or d.inheritable for d in data):
        # The bounding set first: dropping from it needs CAP_SETPCAP, gone after capset.
        for cap in range(_last_capability() + 1):
            _prctl(_PR_CAPBSET_DROP, cap)
        _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
        empty = (_CapData * 2)()
        if libc().capset(ctypes.byref(header), empty) != 0:
            raise OSError(ctypes.get_errno(), "capset could not drop this process's capabilities")
        _, data = _capabilities()
        if any(d.permitted or d.effective or d.inheritable for d in data):  # pragma: no cover
            raise OSError("this process still has capabilities after dropping them")
    else:
        _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    if _prctl(_PR_SET_NO_NEW_PRIVS, 1) != 0 or _prctl(_PR_GET_NO_NEW_PRIVS) != 1:
        raise OSError(ctypes.get_errno(), "could not set no_new_privs")


# --- Landlock ---------------------------------------------------------------------


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 if it has none (or it is disabled)."""
    if not _LINUX:
        return 0
    version: int = libc().syscall(
        _SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION)
    )
    return max(version, 0)


def confine_job(abi: int) -> bool:
    """Put this process in a Landlock domain of its own (``abi``: from
    ``landlock_abi()``, looked up once by the worker). It keeps every file
    access it had; it loses every ptrace-class access to processes outside
    the domain and, from ABI 6, signals to them. Needs ``no_new_privs``.
    False if the kernel has no Landlock. (On ABI 1, Landlock refuses every
    rename or link across directories in any domain: EXDEV.)"""
    if abi < 1:
        return False
    fs = _LANDLOCK_ACCESS_FS_MAKE_CHAR | _LANDLOCK_ACCESS_FS_MAKE_BLOCK
    if abi >= 2:
        fs |= _LANDLOCK_ACCESS_FS_REFER
    # The ruleset's size tells the kernel which fields it has: ABI 6 added "scoped".
    attr = (ctypes.c_uint64 * 3)(fs, 0, _LANDLOCK_SCOPE_SIGNAL) if abi >= 6 else (ctypes.c_uint64 * 1)(fs)
    lib = libc()
    fd = lib.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        if abi >= 2:
            root = os.open("/", os.O_PATH | os.O_CLOEXEC)
            try:
                rule = ctypes.create_string_buffer(
                    _LANDLOCK_ACCESS_FS_REFER.to_bytes(8, sys.byteorder) + root.to_bytes(4, sys.byteorder), 12
                )
                if lib.syscall(_SYS_LANDLOCK_ADD_RULE, fd, _LANDLOCK_RULE_PATH_BENEATH, rule, 0) != 0:
                    raise OSError(ctypes.get_errno(), "landlock_add_rule failed")
            finally:
                os.close(root)
        if lib.syscall(_SYS_LANDLOCK_RESTRICT_SELF, fd, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(fd)
    return True
