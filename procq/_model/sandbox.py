"""``Sandbox``: what a sandboxed lane's jobs may reach, checked when made.
What this kernel can enforce of it is asked in ``_system.sandbox``.

A sandbox is enforced in five parts, each by the kernel mechanisms named
here (the mechanics are in ``_system.sandbox_linux`` and ``_system.seccomp``, the
worker's side in ``_worker.sandbox``):

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

Its bounds (``max_processes``, ``max_memory``, ``max_tmp``: how much of the
machine a job may take) are checked in ``_model.sandbox_bounds`` and
enforced as ``_system.sandbox_bounds`` says (cgroups, ``RLIMIT_NPROC`` in the
job's user namespace, a tmpfs's size).

Never silently weaker: ``_system.sandbox.check`` runs when a queue is made, and a part or
bound this machine cannot enforce raises ``SandboxUnavailable``, naming it
and why, unless the ``Sandbox`` relaxed it (``relax=("namespaces",)``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from procq._model.network import check_network, check_network_bytes
from procq._model.sandbox_bounds import BOUNDS, DEFAULT_MAX_PROCESSES, DEFAULT_MAX_TMP, check_bounds

__all__ = ["PARTS", "Sandbox", "check_lane_sandbox"]

PARTS = ("files", "namespaces", "network", "processes", "privileges")


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
      True: the network as the supervisor has it. A list of hosts, addresses
      or ranges (``["pypi.org", "*.example.com:443", "10.0.0.0/8"]``): only
      those, through procq's filtering proxy (see ``_model.network``).
    - ``network_bytes``: with an allow-list, how many bytes (both ways, all
      connections, request heads and handshakes included) a job may move
      through the proxy; past it its connections are closed and new ones refused. None (the default): no bound.
    - ``max_processes``: how many processes and threads a job's tree may
      run at once (256; None: unbounded). A lane's ``rlimits["nproc"]``, if
      lower, bounds it the same way.
    - ``max_memory``: bytes (or ``"512M"``) of memory a job's tree may hold,
      its temporary files included; past it the kernel kills it and the job
      fails with kind ``"memory"``. None (the default): the lane's
      ``memory_limit``, if it has one; where no memory cgroup may be made,
      that limit binds as in any untrusted lane (its temporary files not
      counted), where an explicit ``max_memory`` is refused.
    - ``max_tmp``: bytes (or ``"64M"``) its temporary directory, and its
      ``/dev/shm``, may each hold (256 MiB; None: the kernel's tmpfs default,
      half the RAM); past it a write fails with ``ENOSPC``.
    - ``relax``: parts (of ``"files"``, ``"namespaces"``, ``"network"``,
      ``"processes"``, ``"privileges"``) and bounds (``"max_processes"``,
      ``"max_memory"``, ``"max_tmp"``) the lane may run without where this
      machine cannot enforce them. Without it, a part or bound that cannot be
      enforced makes ``ProcQueue()`` raise ``SandboxUnavailable``.
    """

    # Given as any iterable of paths (str or os.PathLike); held as a tuple of
    # normalized str paths once checked (so a Sandbox hashes and compares).
    read: Iterable[str | os.PathLike[str]] = ()
    write: Iterable[str | os.PathLike[str]] = ()
    # False, True, or the allow-list (any iterable of entries), held as a tuple of str (see _model.network).
    network: bool | Iterable[str] = False
    network_bytes: int | None = None
    relax: Iterable[str] | str = ()
    max_processes: int | None = DEFAULT_MAX_PROCESSES
    max_memory: int | str | None = None
    max_tmp: int | str | None = DEFAULT_MAX_TMP

    def __post_init__(self) -> None:
        object.__setattr__(self, "read", _paths("read", self.read, False))
        object.__setattr__(self, "write", _paths("write", self.write, True))
        object.__setattr__(self, "network", check_network(self.network))
        check_network_bytes(self.network_bytes, self.network)
        relax = self.relax
        if isinstance(relax, str):
            relax = (relax,)
        if not isinstance(relax, Iterable):
            raise TypeError(f"Sandbox relax must be a tuple of part names, got {type(relax).__name__}")
        relax = tuple(relax)
        for part in relax:
            if part not in PARTS + BOUNDS:
                raise ValueError(
                    f"Sandbox relax: unknown part {part!r}; the parts are {', '.join(PARTS)}; "
                    f"the bounds are {', '.join(BOUNDS)}"
                )
        object.__setattr__(self, "relax", tuple(p for p in PARTS + BOUNDS if p in relax))
        bounds = check_bounds(self.max_processes, self.max_memory, self.max_tmp)
        for name, value in zip(BOUNDS, bounds, strict=True):
            object.__setattr__(self, name, value)


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
