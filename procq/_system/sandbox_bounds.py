"""What enforces each of a sandboxed lane's bounds on this machine
(``max_processes``, ``max_memory``, ``max_tmp``; see ``_model.sandbox_bounds``),
or why none can, and the plan its workers follow.

- ``max_processes``: a ``pids`` cgroup where the supervisor may make one
  (``_system.cgroups``: root, or a delegated cgroup). Else, for a
  supervisor that is not root and whose jobs have their namespaces,
  ``RLIMIT_NPROC``: the kernel counts it per user namespace, and the job's
  user namespace holds only its worker's processes (the worker and the
  process that waits outside for it) and its own. Never ``RLIMIT_NPROC``
  for root: the kernel does not apply it to host uid 0, in any namespace.
- ``max_memory``: a ``memory`` cgroup; nothing else bounds a process tree's
  memory with its tmpfs files in it. Left to default to the lane's
  ``memory_limit`` where no cgroup may be made, the lane's limit still binds
  as in any untrusted lane (``RLIMIT_AS`` on the job and the supervisor's
  watch of its process tree), its tmpfs files uncounted; only a
  ``max_memory`` given explicitly is refused there.
- ``max_tmp``: the ``size=`` of the tmpfs mounted on the job's ``/tmp`` and
  ``/dev/shm``, which needs the namespaces part (without it the job's
  temporary directory is in the host's).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from procq._model.settings import format_size
from procq._system import cgroups

if TYPE_CHECKING:
    from procq._model.job import Lane
    from procq._model.sandbox import Sandbox

__all__ = ["NPROC_SLACK", "bounds"]

#: The processes of a job's user namespace that are not the job's: its
#: worker and the process that waits for it outside its PID namespace.
NPROC_SLACK = 2


def bounds(sandbox: Sandbox, lane: Lane, namespaces: bool) -> tuple[dict[str, str], dict[str, str], dict[str, Any]]:
    """What enforces each bound of ``sandbox`` in ``lane`` here (``namespaces``:
    the worker's namespaces are made), why each that cannot be is not, and
    the plan for the lane's workers (plain data): ``cgroups`` (controller ->
    [version, parent]), ``pids_max``, ``memory_max``, ``nproc``, ``tmp_size``."""
    have: dict[str, str] = {}
    lack: dict[str, str] = {}
    plan: dict[str, Any] = {"cgroups": {}, "pids_max": None, "memory_max": None, "nproc": None, "tmp_size": None}
    usable = cgroups.usable()
    # (Held as numbers once checked: ``Sandbox.__post_init__``, ``Lane``'s rlimits.)
    nproc = (lane.rlimits or {}).get("nproc")
    limits = [int(n) for n in (sandbox.max_processes, nproc) if n is not None]
    processes = min(limits) if limits else None
    pids = usable["pids"]
    if processes is None:
        have["max_processes"] = "unbounded (max_processes=None)"
    elif isinstance(pids, cgroups.Place):
        have["max_processes"] = f"{pids.describe()}: at most {processes} processes and threads"
        plan["cgroups"]["pids"] = [pids.version, pids.parent]
        plan["pids_max"] = processes
    elif namespaces and os.geteuid() != 0:
        have["max_processes"] = f"RLIMIT_NPROC in the job's user namespace: at most {processes} processes and threads"
        plan["nproc"] = processes + NPROC_SLACK
    else:
        why = (
            "RLIMIT_NPROC does not bind root (the kernel never applies it to host uid 0)"
            if os.geteuid() == 0
            else "RLIMIT_NPROC counts every process of this user without the namespaces part"
        )
        lack["max_processes"] = f"needs a pids cgroup, and {pids}; {why}"
    explicit = sandbox.max_memory is not None
    memory = int(sandbox.max_memory) if sandbox.max_memory is not None else lane.memory_limit_bytes
    place = usable["memory"]
    if memory is None:
        have["max_memory"] = "unbounded (no max_memory, and the lane has no memory_limit)"
    elif isinstance(place, cgroups.Place):
        have["max_memory"] = f"{place.describe()}: {format_size(memory)}, its temporary files included"
        plan["cgroups"]["memory"] = [place.version, place.parent]
        plan["memory_max"] = memory
    elif not explicit:
        # The lane's memory_limit binds as in any untrusted lane; only the
        # tmpfs files, which no process maps, escape it without a cgroup.
        have["max_memory"] = (
            f"the lane's memory_limit, as in any untrusted lane (an address-space limit on the job and the "
            f"supervisor's watch of its process tree): {format_size(memory)}, its temporary files not "
            f"included (they need a memory cgroup, and {place})"
        )
    else:
        lack["max_memory"] = f"needs a memory cgroup, and {place}"
    tmp = None if sandbox.max_tmp is None else int(sandbox.max_tmp)
    if tmp is None:
        have["max_tmp"] = "unbounded (max_tmp=None): the kernel's tmpfs default, half the RAM"
    elif namespaces:
        have["max_tmp"] = f"the size of its tmpfs /tmp and /dev/shm: {format_size(tmp)} each"
        plan["tmp_size"] = tmp
    else:
        lack["max_tmp"] = "needs the namespaces part: without it the job's temporary directory is in the host's"
    return have, lack, plan
