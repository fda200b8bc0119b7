"""What this kernel can enforce of a ``Sandbox``, asked once per process, and
the check that refuses a part it cannot enforce (``SandboxUnavailable``)
when a queue is made. The probe runs in a process of its own that does what a
sandboxed worker does (``_system.sandbox_linux.probe_main``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from procq._model.errors import SandboxUnavailable
from procq._model.sandbox import Sandbox
from procq._system.processes import import_path
from procq._system.sandbox_bounds import bounds

if TYPE_CHECKING:
    from procq._model.job import Lane

__all__ = ["check", "enforced", "kernel", "sandbox_config"]

_log = logging.getLogger("procq.worker")


# --- what the kernel gives ----------------------------------------------------------------------

_kernel: dict[str, Any] | None = None
_enforced: dict[tuple[Sandbox, int | None, int | None], dict[str, str]] = {}

_USERNS_HELP = (
    "On Ubuntu 23.10 and later, AppArmor restricts unprivileged user namespaces "
    "(kernel.apparmor_restrict_unprivileged_userns=1): allow them with "
    "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`, or give this Python an AppArmor "
    "profile with the `userns,` rule. Debian's kernel.unprivileged_userns_clone=0 and "
    "user.max_user_namespaces=0 disable them too; a container's seccomp profile may refuse them"
)


def kernel() -> dict[str, Any]:
    """What this kernel gives an unprivileged sandbox, probed once per
    process in a process of its own (``_system.sandbox_linux.probe_main``)."""
    global _kernel
    if _kernel is None:
        _kernel = _probe()
    return _kernel


def _probe() -> dict[str, Any]:
    if not sys.platform.startswith("linux"):
        why = [errno.ENOSYS, f"sandboxes are Linux's ({sys.platform})"]
        return {"landlock": 0, "seccomp": why, "namespaces": why}
    code = (
        "import sys, json; sys.path[:0] = json.loads(sys.argv[1]); "
        "from procq._system.sandbox_linux import probe_main; probe_main()"
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
        net = "" if sandbox.network is True else " and network"
        have["namespaces"] = f"user, mount, PID, IPC, UTS{net} namespaces"
    else:
        lack["namespaces"] = f"needs unprivileged user namespaces, which this kernel refused: {_refusal(ns)}"
    if isinstance(sandbox.network, tuple):
        if ns is not None:
            lack["network"] = f"an allow-list needs a network namespace of the jobs' own: {_refusal(ns)}"
        elif seccomp is not None:
            lack["network"] = f"an allow-list needs a seccomp filter: {seccomp[1]}"
        else:
            how = ["procq's filtering proxy, a network namespace with only loopback"]
            have["network"] = "the allow-list: " + ", ".join(how + (["Landlock TCP rules"] if abi >= 4 else []))
    elif not sandbox.network:
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


def _all(sandbox: Sandbox, lane: Lane) -> tuple[dict[str, str], dict[str, str], dict[str, Any]]:
    """What enforces each part and bound of ``sandbox`` in ``lane`` here, why
    each that cannot be is not, and the bounds' plan for its workers."""
    have, lack = _parts(sandbox, kernel())
    bounded, unbounded, plan = bounds(sandbox, lane, "namespaces" in have)
    return {**have, **bounded}, {**lack, **unbounded}, plan


def _key(sandbox: Sandbox, lane: Lane) -> tuple[Sandbox, int | None, int | None]:
    """What a lane's bounds depend on besides its sandbox: its memory_limit and rlimits["nproc"]."""
    nproc = (lane.rlimits or {}).get("nproc")
    return sandbox, lane.memory_limit_bytes, None if nproc is None else int(nproc)


def check(lanes: Mapping[str, Lane]) -> None:
    """Raise ``SandboxUnavailable`` if a sandboxed lane asks for a part or
    bound this machine cannot enforce and did not relax it; log once at
    DEBUG what each sandboxed lane enforces."""
    for name, lane in lanes.items():
        sandbox: Sandbox | None = getattr(lane, "sandbox", None)
        if sandbox is None:
            continue
        have, lack, _ = _all(sandbox, lane)
        missing = {part: why for part, why in lack.items() if part not in sandbox.relax}
        if missing:
            part, why = next(iter(missing.items()))
            what = "bound" if part.startswith("max_") else "part"
            raise SandboxUnavailable(
                f"lane {name!r}: the sandbox's {part} {what} cannot be enforced here: {why}. "
                f"To run without it, say so: Sandbox(relax=({part!r},))",
                part,
            )
        _enforced.setdefault(_key(sandbox, lane), have)
        if _log.isEnabledFor(logging.DEBUG):
            relaxed = ", ".join(p for p in lack if p in sandbox.relax) or "nothing"
            enforced = "; ".join(f"{part}: {how}" for part, how in have.items())
            _log.debug("lane %r is sandboxed: %s (relaxed: %s)", name, enforced, relaxed)


def enforced(sandbox: Sandbox | None, lane: Lane) -> dict[str, str] | None:
    """What enforces each part and bound of ``lane``'s ``sandbox`` here (after ``check``), for ``stats()``."""
    if sandbox is None:
        return None
    return dict(_enforced.get(_key(sandbox, lane)) or _all(sandbox, lane)[0])


def sandbox_config(sandbox: Sandbox | None, lane: Lane) -> dict[str, Any] | None:
    """What a sandboxed lane's worker needs to know, as plain data (``bounds``:
    how its workers enforce each bound that can be enforced here)."""
    if sandbox is None:
        return None
    have, _, plan = _all(sandbox, lane)
    parts = [part for part in have if not part.startswith("max_")]
    return {
        "bounds": plan,
        "read": [os.fspath(p) for p in sandbox.read],
        "write": [os.fspath(p) for p in sandbox.write],
        # A list relaxed (the kernel lacks what it needs) is no network at all, never all of it.
        "network": sandbox.network is True,
        "parts": sorted(parts),
        "landlock": kernel()["landlock"],
    }
