"""Thread limits of native libraries (BLAS, OpenMP) applied in a worker, with
``threadpoolctl``, to the libraries it has loaded already.

Why: a library sizes its thread pool from the environment as it loads. A
worker forked from the forkserver or from its lane's template has the
libraries they loaded (numpy, in a script that imports it at its top) with
the pools they sized there, and setting ``OMP_NUM_THREADS`` in the worker
changes nothing for them: two workers on two CPUs then run four BLAS
threads. So the joblib backend sends its limits with each batch, and the
worker applies them before the batch runs, again whenever it has loaded more
modules since (a new library, perhaps); the environment still sizes what it
loads later. Without ``threadpoolctl``, nothing is done here.
"""

from __future__ import annotations

import sys

__all__ = ["apply_thread_limits", "thread_limits"]

#: The threadpoolctl APIs, and the variable each takes its limit from.
_LIMIT_VARS = (("blas", "OPENBLAS_NUM_THREADS"), ("openmp", "OMP_NUM_THREADS"))
#: The limits applied in this process, and the size of ``sys.modules`` then.
_applied: tuple[tuple[tuple[str, int], ...], int] | None = None


def thread_limits(env: dict[str, str]) -> tuple[tuple[str, int], ...]:
    """The per-API limits an environment asks for (``(("blas", 1), ("openmp", 1))``)."""
    limits = []
    for api, var in _LIMIT_VARS:
        try:
            limits.append((api, int(env[var])))
        except (KeyError, ValueError):
            continue
    return tuple(limits)


def apply_thread_limits(limits: tuple[tuple[str, int], ...]) -> None:
    """Set the pools of the libraries loaded in this process to ``limits``
    (once per set of limits and of loaded modules)."""
    global _applied
    loaded = len(sys.modules)
    if _applied == (limits, loaded):
        return
    try:
        import threadpoolctl
    except ImportError:
        return
    threadpoolctl.threadpool_limits(limits=dict(limits))
    _applied = (limits, len(sys.modules))
