"""The job of the heavy-module crash batch (``crash_heavy``): a module that
imports numpy and scipy's statistics, sparse matrices and optimizers, as a
data job's module does; importing it costs a new worker about 0.4 s of CPU."""

from __future__ import annotations

import numpy
import scipy.optimize
import scipy.sparse
import scipy.stats

from bench import jobs


def double_or_die(i: int, path: str) -> int:
    """``jobs.double_or_die``, from a module that a worker must import first."""
    return int(numpy.int64(jobs.double_or_die(i, path)))


def names() -> str:
    """What the module holds, so that nothing above is unused."""
    return (
        f"{scipy.stats.norm.__class__.__name__} {scipy.sparse.csr_matrix.__name__} {scipy.optimize.minimize.__name__}"
    )
