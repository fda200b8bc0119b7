"""``Sandbox``: what a sandboxed lane's jobs may reach, checked when made;
and what this kernel can enforce of it, asked once per process.

A sandbox is enforced in five parts, each by the kernel mechanisms named
here (the mechanics are in ``_sandbox_linux`` and ``_seccomp``):

- ``files``: Landlock filesystem rules (ABI 3: reads, writes, renames,
  links, truncation) allow the job only its paths.
- ``namespaces``: user, mount, PID, IPC, UTS and network namespaces, which need
  unprivileged user namespaces: the job sees only its paths (read-only
  where it may not write: ``chmod``, ``utime``, a UNIX socket's path), only
  the processes of its worker's namespace, and no network interface.
- ``network`` (with ``network=False``): a seccomp filter that allows no
  socket family but ``AF_UNIX``, and Landlock's TCP rules (ABI 4) where the
  kernel has them.
- ``processes``: Landlock scoping (ABI 6): no signal, no ptrace-class
  access and no abstract UNIX socket outside the job's own tree.
- ``privileges``: a seccomp filter that refuses new namespaces, mounts,
  ``ptrace`` and the kernel's rarely needed, often exploited calls.

Never silently weaker: ``check`` runs when a queue is made, and a part the
kernel cannot enforce raises ``SandboxUnavailable``, naming it and why,
unless the ``Sandbox`` relaxed it (``relax=("namespaces",)``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from procq._errors import SandboxUnavailable

if TYPE_CHECKING:
    from procq._job import Lane

__all__ = ["PARTS", "Sandbox", "check", "check_lane_sandbox", "enforced", "sandbox_config"]

PARTS = ("files", "namespaces", "network", "processes", "privileges")

_log = logging.getLogger("procq.worker")


def _paths(what: str, value: Any, directories: bool) -> tuple[str, ...]:
    if isinstance(value, (str, bytes, os.PathLike)) or not isinstance(value, Iterable):
        raise TypeError(f"Sandbox {what} must be a tuple of paths, got {type(value).__name__}: {value!r}")
    paths = []
    for p in value:
        if not isinstance(p, (str, os.PathLike)):
            raise TypeError(f"Sandbox {what} paths must be str or os.PathLike, got {type(p).__name__}: {p!r}")
        path = os.fspath(p)
        if not isinstance(path, str):
            raise TypeError(f"Sandbox {what} paths must be str, got {type(path).__name__}: {path!r}")
        if not os.path.isabs(path):
            raise ValueError(f"Sandbox {what} path {path!r} is relative: give an absolute path")
        if not os.path.exists(path):
            raise ValueError(f"Sandbox {what} path {path!r} does not exist")
        if directories and not os.path.isdir(path):
            raise ValueError(f"Sandbox {what} path {path!r} is a file, not a directory: a job writes in directories")
        path = os.path.normpath(path)
        if os.path.realpath(path) == "/":
            raise ValueError(f"Sandbox {what} path {path!r} is the whole filesystem: give the directories a job needs")
        if path not in paths:
            paths.append(path)
    return tuple(paths)


@dataclass(frozen=True)
class Sandbox:
    """What the jobs of a sandboxed lane (``Lane(trusted=False, sandbox=...)``) may reach.

    - ``read``: absolute paths (files or directories) a job may read, beyond
      what Python needs to run it: the interpreter's prefixes, every
      directory on the supervisor's ``sys.path`` (keep secrets out of them),
      system libraries and programs (``/usr``).
    - ``write``: absolute paths of directories a job may read and write, and
      create, rename and delete in. Beyond them it writes only to a private
      temporary directory made for the job (its ``TMPDIR``), removed after it.
    - ``network``: False (the default): no socket but ``AF_UNIX`` and no
      network interface; a job's UNIX sockets reach only its own tree.
      True: the network as the supervisor has it.
    - ``relax``: parts (of ``"files"``, ``"namespaces"``, ``"network"``,
      ``"processes"``, ``"privileges"``) the lane may run without where the
      kernel cannot enforce them. Without it, a part the kernel lacks makes
      ``ProcQueue()`` raise ``SandboxUnavailable``.
    """

    # Given as any iterable of paths (str or os.PathLike); held as a tuple of
    # normalized str paths once checked (so a Sandbox hashes and compares).
    read: Iterable[str | os.PathLike[str]] = ()
    write: Iterable[str | os.PathLike[str]] = ()
    network: bool = False
    relax: Iterable[str] | str = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "read", _paths("read", self.read, False))
        object.__setattr__(self, "write", _paths("write", self.write, True))
        if not isinstance(self.network, bool):
            raise TypeError(f"Sandbox network must be a bool, got {type(self.network).__name__}")
        relax = self.relax
        if isinstance(relax, str):
            relax = (relax,)
        if not isinstance(relax, Iterable):
            raise TypeError(f"Sandbox relax must be a tuple of part names, got {type(relax).__name__}")
        relax = tuple(relax)
        for part in relax:
            if part not in PARTS:
                raise ValueError(f"Sandbox relax: unknown part {part!r}; the parts are {', '.join(PARTS)}")
        object.__setattr__(self, "relax", tuple(p for p in PARTS if p in relax))


def check_lane_sandbox(value: Any, trusted: bool) -> Sandbox | None:
    """``Lane(sandbox=...)`` resolved: True is ``Sandbox()``; False and None are none."""
    if value is None or value is False:
        return None
    if value is True:
        value = Sandbox()
    if not isinstance(value, Sandbox):
        raise TypeError(f"lane sandbox must be a procq.Sandbox, True or None, got {type(value).__name__}")
    if trusted:
        raise ValueError("lane sandbox needs an untrusted lane: give Lane(trusted=False, sandbox=...)")
    return value


# --- what the kernel gives ----------------------------------------------------------------------

_kernel: dict[str, Any] | None = None
_enforced: dict[Sandbox, dict[str, str]] = {}

_USERNS_HELP = (
    "On Ubuntu 23.10 and later, AppArmor restricts unprivileged user namespaces "
    "(kernel.apparmor_restrict_unprivileged_userns=1): allow them with "
    "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`, or give this Python an AppArmor "
    "profile with the `userns,` rule. Debian's kernel.unprivileged_userns_clone=0 and "
    "user.max_user_namespaces=0 disable them too; a container's seccomp profile may refuse them"
)


def kernel() -> dict[str, Any]:
    """What this kernel gives an unprivileged sandbox, probed once per
    process in a process of its own (``_sandbox_linux.probe_main``)."""
    global _kernel
    if _kernel is None:
        _kernel = _probe()
    return _kernel


def _probe() -> dict[str, Any]:
    if not sys.platform.startswith("linux"):
        why = [errno.ENOSYS, f"sandboxes are Linux's ({sys.platform})"]
        return {"landlock": 0, "seccomp": why, "namespaces": why}
    from procq._processes import import_path

    code = (
        "import sys, json; sys.path[:0] = json.loads(sys.argv[1]); "
        "from procq._sandbox_linux import probe_main; probe_main()"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", code, json.dumps(import_path())],
            capture_output=True, text=True, timeout=60, cwd="/", env={},
        )  # fmt: skip
        report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError) as exc:
        why = [0, f"the probe failed: {exc!r}"]
        return {"landlock": 0, "seccomp": why, "namespaces": why}
    return report


_CAUSES = {
    errno.ENOSPC: "user.max_user_namespaces is 0 here, or the limit is reached",
    errno.EUSERS: "user namespaces are nested too deep",
    errno.EINVAL: "this kernel may be built without user namespaces",
}


def _refusal(why: list[Any]) -> str:
    """What the kernel said when the worker's namespaces were probed, why, and how to allow them."""
    code, text = why
    name = errno.errorcode.get(code, "")
    reason = f"{text} ({name})" if name and name not in text else text
    if code in _CAUSES:
        reason += f": {_CAUSES[code]}"
    return f"{reason}. {_USERNS_HELP}"


def _parts(sandbox: Sandbox, k: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """What each part of ``sandbox`` is enforced by here, and why each part the kernel lacks is missing."""
    abi, seccomp, ns = k["landlock"], k["seccomp"], k["namespaces"]
    have: dict[str, str] = {}
    lack: dict[str, str] = {}
    if abi >= 3:
        have["files"] = f"Landlock ABI {abi} rules" + ("; a read-only view (mount namespace)" if ns is None else "")
    else:
        lack["files"] = f"needs Landlock ABI 3 (Linux 6.2), this kernel has {abi or 'no Landlock'}"
    if ns is None:
        have["namespaces"] = "user, mount, PID, IPC, UTS" + ("" if sandbox.network else " and network") + " namespaces"
    else:
        lack["namespaces"] = f"needs unprivileged user namespaces, which this kernel refused: {_refusal(ns)}"
    if not sandbox.network:
        if seccomp is None:
            how = ["seccomp socket families"] + (["Landlock TCP rules"] if abi >= 4 else [])
            have["network"] = "none: " + ", ".join(how + (["a network namespace"] if ns is None else []))
        else:
            lack["network"] = f"needs a seccomp filter: {seccomp[1]}"
    if abi >= 6:
        have["processes"] = "Landlock scoping" + ("; a PID namespace" if ns is None else "")
    else:
        lack["processes"] = f"needs Landlock ABI 6 (Linux 6.12) to scope signals, this kernel has {abi}"
    if seccomp is None:
        have["privileges"] = "no capability, no_new_privs, a seccomp filter"
    else:
        lack["privileges"] = f"needs a seccomp filter: {seccomp[1]}"
    return have, lack


def check(lanes: Mapping[str, Lane]) -> None:
    """Raise ``SandboxUnavailable`` if a sandboxed lane asks for a part this
    kernel cannot enforce and did not relax it; log once at DEBUG what each
    sandboxed lane enforces."""
    for name, lane in lanes.items():
        sandbox: Sandbox | None = getattr(lane, "sandbox", None)
        if sandbox is None:
            continue
        have, lack = _parts(sandbox, kernel())
        missing = {part: why for part, why in lack.items() if part not in sandbox.relax}
        if missing:
            part, why = next(iter(missing.items()))
            raise SandboxUnavailable(
                f"lane {name!r}: the sandbox's {part} part cannot be enforced here: {why}. "
                f"To run without it, say so: Sandbox(relax=({part!r},))",
                part,
            )
        if sandbox not in _enforced:
            _enforced[sandbox] = have
        if _log.isEnabledFor(logging.DEBUG):
            relaxed = ", ".join(p for p in lack if p in sandbox.relax) or "nothing"
            enforced = "; ".join(f"{part}: {how}" for part, how in have.items())
            _log.debug("lane %r is sandboxed: %s (relaxed: %s)", name, enforced, relaxed)


def enforced(sandbox: Sandbox | None) -> dict[str, str] | None:
    """What ``sandbox`` is enforced by here (after ``check``), for ``stats()``."""
    if sandbox is None:
        return None
    return dict(_enforced.get(sandbox) or _parts(sandbox, kernel())[0])


def sandbox_config(sandbox: Sandbox | None) -> dict[str, Any] | None:
    """What a sandboxed lane's worker needs to know, as plain data."""
    if sandbox is None:
        return None
    parts = enforced(sandbox) or {}
    return {
        "read": [os.fspath(p) for p in sandbox.read],
        "write": [os.fspath(p) for p in sandbox.write],
        "network": sandbox.network,
        "parts": sorted(parts),
        "landlock": kernel()["landlock"],
    }
