"""A ``Sandbox``'s bounds on how much of the machine a job may take: the
tasks it may run at once (``max_processes``), the memory it may hold
(``max_memory``, its temporary files included) and the size of its
temporary directory (``max_tmp``). Checked here when a ``Sandbox`` is made;
what enforces each on this machine is asked in ``_system.sandbox_bounds``.
"""

from __future__ import annotations

from typing import Any

from procq._model.settings import parse_size

__all__ = ["BOUNDS", "DEFAULT_MAX_PROCESSES", "DEFAULT_MAX_TMP", "check_bounds"]

#: The bounds, by the name of their field (and the name ``relax=`` gives them).
BOUNDS = ("max_processes", "max_memory", "max_tmp")
DEFAULT_MAX_PROCESSES = 256
DEFAULT_MAX_TMP = 256 << 20


def check_bounds(max_processes: Any, max_memory: Any, max_tmp: Any) -> tuple[int | None, int | None, int | None]:
    """The three bounds as numbers (None: unbounded; for ``max_memory``, the
    lane's ``memory_limit``); ``TypeError``/``ValueError`` naming a bad one."""
    if max_processes is not None and (isinstance(max_processes, bool) or not isinstance(max_processes, int)):
        raise TypeError(f"Sandbox max_processes must be an int or None, got {type(max_processes).__name__}")
    if max_processes is not None and max_processes < 1:
        raise ValueError(f"Sandbox max_processes must be at least 1 (the job's own process), got {max_processes}")
    return (
        max_processes,
        parse_size("Sandbox max_memory", max_memory),
        parse_size("Sandbox max_tmp", max_tmp),
    )
