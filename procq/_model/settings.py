"""The checks behind settings: byte sizes (``"512M"``), and a lane's worker
settings (``env``, ``rlimits``, ``cwd``, how many workers, ``kill_grace``),
refused where they are written, with a message that names the setting and the rule.

A setting that no worker could start with is refused at ``Lane()``, not when
every worker then dies while starting: an environment the kernel cannot pass
on, a limit above the one the workers inherit, a directory that is not there.
``check_descriptors`` is ``ProcQueue()``'s: all its lanes' workers must fit the
process's limit of open descriptors.
"""

from __future__ import annotations

import math
import os
import re
import resource
from collections.abc import Mapping

__all__ = [
    "FDS_PER_WORKER",
    "FDS_RESERVED",
    "MAX_KILL_GRACE",
    "MAX_WORKERS",
    "RLIMITS",
    "check_cwd",
    "check_descriptors",
    "check_env",
    "check_kill_grace",
    "check_rlimits",
    "format_size",
    "parse_size",
]

#: The most workers one lane may have. Each is a process of its own (a Python
#: interpreter: 10 MiB and more) watched through about three descriptors of the
#: supervisor's, so a lane of this many already asks for 40 GiB and 12,000
#: descriptors; a larger number is a slip (a count of items passed as a count of
#: workers), and would otherwise fail only later, part-way through starting them.
MAX_WORKERS = 4096

#: The longest ``kill_grace`` a lane may give: an hour, longer than any cleanup
#: after SIGTERM should take. A longer grace (or an endless one) would hold the
#: job's key, its worker and its waiters' answer for as long: a job ended by a
#: cancel or a timeout answers once its tree is gone.
MAX_KILL_GRACE = 3600.0

#: Descriptors the supervisor holds per worker (its pipe, a pidfd, and under
#: multiprocessing its sentinel), and those kept free for everything else.
FDS_PER_WORKER = 3
FDS_RESERVED = 64

#: Resource limits a lane may set on its workers: name -> what the value counts.
RLIMITS = {
    "cpu": "seconds of CPU time per job",
    "fsize": "bytes: the largest file a job may write",
    "nofile": "open file descriptors",
    "nproc": "processes of the user (the kernel does not apply it to root)",
}
_RLIMIT_IDS = {
    "cpu": resource.RLIMIT_CPU,
    "fsize": resource.RLIMIT_FSIZE,
    "nofile": resource.RLIMIT_NOFILE,
    "nproc": resource.RLIMIT_NPROC,
}
#: The largest value setrlimit takes from Python (a C long long); beyond it a limit cannot be set at all.
_RLIMIT_MAX = 2**63 - 1

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def format_size(n: int) -> str:
    """``52428800`` -> ``"50 MiB"``; exact, so a limit reads as it was given."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit} ({n} bytes)"
    return f"{n} bytes"


def parse_size(what: str, value: int | str | None) -> int | None:
    """Bytes from an int or a string such as ``"512M"``, ``"2G"``, ``"1.5GiB"``.

    Units are powers of 1024 (K, M, G, T; a trailing ``B`` or ``iB`` is
    allowed), as ``ulimit`` and container runtimes read them.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{what} must be a number of bytes or a string such as '512M', got {type(value).__name__}")
    given = value
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match is None:
            raise ValueError(f"{what} must be a number of bytes or a string such as '512M' or '2G', got {value!r}")
        number, unit, _ = match.groups()
        value = int(float(number) * _UNITS[unit.lower()])
    if value < 1:
        raise ValueError(f"{what} must be at least 1 byte, got {given!r}")
    return value


def check_kill_grace(grace: float) -> float:
    """A lane's ``kill_grace``: seconds from 0 to ``MAX_KILL_GRACE``."""
    if (
        isinstance(grace, bool)
        or not isinstance(grace, (int, float))
        or not math.isfinite(grace)
        or not 0 <= grace <= MAX_KILL_GRACE
    ):
        raise ValueError(
            f"lane kill_grace must be a number of seconds from 0 to {MAX_KILL_GRACE:g} (an hour), got {grace!r}"
        )
    return float(grace)


def check_rlimits(rlimits: Mapping[str, int | str] | None) -> dict[str, int] | None:
    """Each limit known, a positive int, and no higher than this process's own
    hard limit: a worker inherits that hard limit and can only lower it (root
    could raise it, but a lane that works only as root is refused alike)."""
    if rlimits is None:
        return None
    if not isinstance(rlimits, Mapping):
        raise TypeError(f"lane rlimits must be a mapping such as {{'cpu': 10}}, got {type(rlimits).__name__}")
    checked: dict[str, int] = {}
    for name, value in rlimits.items():
        if name not in RLIMITS:
            known = ", ".join(repr(k) for k in RLIMITS)
            raise ValueError(f"lane rlimits: unknown rlimit {name!r}; procq sets {known}")
        what = f"lane rlimits[{name!r}]"
        if name == "fsize":
            size = parse_size(what, value)
            assert size is not None
            value = size
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be an int of at least 1 ({RLIMITS[name]}), got {value!r}")
        hard = resource.getrlimit(_RLIMIT_IDS[name])[1]
        if hard != resource.RLIM_INFINITY and value > hard:
            raise ValueError(
                f"{what} must be at most {hard}, this process's hard limit, which its workers inherit "
                f"and cannot raise; got {value}"
            )
        if value > _RLIMIT_MAX:
            raise ValueError(f"{what} must be at most {_RLIMIT_MAX}, the largest limit the system takes; got {value}")
        checked[name] = value
    return checked


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    """Names and values the kernel can pass to a new process: a variable is
    ``name=value`` in a NUL-terminated string, so a name may hold neither
    ``=`` nor NUL and may not be empty, and a value may not hold NUL."""
    if not isinstance(env, Mapping):
        raise TypeError(f"lane env must be a mapping of str to str, got {type(env).__name__}")
    checked: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str):
            raise TypeError(f"lane env names must be str, got {type(name).__name__}: {name!r}")
        if not isinstance(value, str):
            raise TypeError(f"lane env[{name!r}] must be a str, got {type(value).__name__}: {value!r}")
        if not name:
            raise ValueError("lane env names must not be empty")
        if "=" in name:
            raise ValueError(f"lane env name {name!r} holds '=', which ends a name: no variable can have it")
        if "\0" in name:
            raise ValueError(f"lane env name {name!r} holds NUL, which no environment can carry")
        if "\0" in value:
            raise ValueError(f"lane env[{name!r}] holds NUL, which no environment can carry")
        checked[name] = value
    return checked


def check_cwd(cwd: str | os.PathLike[str]) -> str:
    """An existing directory the workers can enter, as a str (a relative path
    is kept relative: workers start where the supervisor runs)."""
    if not isinstance(cwd, (str, os.PathLike)):
        raise TypeError(f"lane cwd must be a path, got {type(cwd).__name__}")
    path = os.fspath(cwd)
    if not isinstance(path, str):
        raise TypeError(f"lane cwd must be a str path, got {type(path).__name__}")
    if "\0" in path:
        raise ValueError(f"lane cwd {path!r} holds NUL, which no path can")
    if not os.path.exists(path):
        raise ValueError(f"lane cwd {path!r} does not exist")
    if not os.path.isdir(path):
        raise ValueError(f"lane cwd {path!r} is not a directory")
    if not os.access(path, os.X_OK):
        raise ValueError(f"lane cwd {path!r} cannot be entered: this process may not search it")
    return path


def check_descriptors(total: int) -> None:
    """The queue's workers in all (``total``) must fit this process's limit of
    open file descriptors, with those already open and some to spare; else the
    queue would fail part-way through starting them (or later, at a replacement)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:  # no /proc: count none as used
        used = 0
    needed = total * FDS_PER_WORKER + FDS_RESERVED
    if used + needed <= soft:
        return
    fits = max(0, (soft - used - FDS_RESERVED) // FDS_PER_WORKER)
    how = (
        f"raise it (up to the hard limit, {hard}) with `ulimit -n` or resource.setrlimit(resource.RLIMIT_NOFILE, ...)"
        if hard == resource.RLIM_INFINITY or hard > soft
        else "raise the hard limit as root (limits.conf, systemd's LimitNOFILE)"
    )
    raise ValueError(
        f"the lanes' {total} workers need about {needed} file descriptors in this process, and with {used} "
        f"open it may have {soft} (RLIMIT_NOFILE): at most {fits} workers fit; {how}, or use fewer workers"
    )
