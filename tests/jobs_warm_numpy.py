"""A job module that imports numpy, whose OpenBLAS starts its threads as it
loads unless told to start none: see test_warm_starts.py."""

from __future__ import annotations

import os

import numpy

IMPORTED_IN = os.getpid()


def where() -> tuple[int, int]:
    return os.getpid(), IMPORTED_IN


def blas_sum() -> float:
    return float(numpy.ones((50, 50)).dot(numpy.ones(50)).sum())
