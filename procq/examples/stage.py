"""Pipeline stages for ``procq run``: each takes one item (a JSON value) and
returns a JSON value. ``square`` is the one docs/ecosystem.md runs."""

from __future__ import annotations

import ctypes
from typing import Any


def square(item: Any) -> dict[str, Any]:
    """``{"n": n, "square": n * n}`` for a number; an exception for anything else."""
    if isinstance(item, bool) or not isinstance(item, (int, float)):
        raise TypeError(f"square needs a number, got {type(item).__name__}")
    return {"n": item, "square": item * item}


def crash_on_13(item: Any) -> Any:
    """``square``, except that 13 crashes its worker with a segfault: the
    other items run on, and 13 fails alone with kind "crashed"."""
    if item == 13:
        ctypes.string_at(0)
    return square(item)
