"""A job's large buffers out of the pickle: what pickle protocol 5 (PEP 574)
leaves out of band, and how procq makes it leave more.

A trusted lane's job arguments and results are pickled with protocol 5 and a
``buffer_callback``: the buffers an object hands to pickle as a
``PickleBuffer`` (a numpy array, anything built on one, an Arrow buffer, ...)
leave the stream when they come to ``OOB_BYTES`` or more in all. ``bytes``
and ``bytearray`` values of ``OOB_BYTES`` or more leave it too, where they
are found a few levels into tuples, lists and dicts (``_lift``), and a
``memoryview``, which plain pickle refuses, pickles (``_BufferPickler``).
Where the buffers go, and who frees them, is ``_wire.shm``'s.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from typing import Any

from procq._wire.main_by_value import MAIN

__all__ = ["OOB_BYTES", "dumps_in_band", "dumps_oob"]

#: A message's buffers travel out of band (through a segment) when they come
#: to this many bytes or more; fewer stay in the pickle. Measured
#: (``python -m bench.arrays --sweep``): a segment costs a few system calls on
#: each side, which the pipe outruns up to about 128 KiB; from 160 KiB on the
#: segment is faster both ways.
OOB_BYTES = 160 << 10


class _BufferPickler(pickle.Pickler):
    """Protocol 5 with a ``memoryview`` as a ``PickleBuffer`` (plain pickle
    refuses one). Used only when plain pickle refuses: the hook is a Python
    call per object pickled."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is memoryview and obj.c_contiguous:
            return _memoryview, (pickle.PickleBuffer(obj), obj.format, obj.shape)
        return NotImplemented


def _memoryview(buffer: Any, fmt: str, shape: tuple[int, ...]) -> memoryview:
    view: Any = memoryview(buffer)
    if view.format != fmt or view.shape != shape:
        view = view.cast("B").cast(fmt, shape)
    result: memoryview = view
    return result


class _OutOfBand:
    """A large ``bytes`` or ``bytearray`` that pickles as a ``PickleBuffer``
    (pickle writes these types into its stream itself, and calls no hook for
    them): unpickled, it is a ``bytes`` or ``bytearray`` again, copied once
    out of the buffer."""

    __slots__ = ("value",)

    def __init__(self, value: bytes | bytearray) -> None:
        self.value = value

    def __reduce_ex__(self, protocol: Any) -> Any:
        return type(self.value), (pickle.PickleBuffer(self.value),)


#: How deep into tuples, lists and dicts, and how many of their items, ``_lift`` looks.
_LIFT_DEPTH = 3
_LIFT_ITEMS = 1000


def _lift(obj: Any, depth: int = _LIFT_DEPTH) -> Any:
    """``obj`` with its large ``bytes`` and ``bytearray`` values as ``_OutOfBand``,
    where they are no deeper than ``_LIFT_DEPTH`` in plain tuples, lists and
    dict values (``obj`` itself when there are none: deeper ones stay in band)."""
    t = type(obj)
    if t is bytes or t is bytearray:
        return _OutOfBand(obj) if len(obj) >= OOB_BYTES else obj
    if depth == 0:
        return obj
    if t is tuple or t is list:
        if len(obj) > _LIFT_ITEMS:
            return obj
        items = [_lift(item, depth - 1) for item in obj]
        if all(a is b for a, b in zip(items, obj, strict=True)):
            return obj
        return tuple(items) if t is tuple else items
    if t is dict:
        if len(obj) > _LIFT_ITEMS:
            return obj
        values = {key: _lift(value, depth - 1) for key, value in obj.items()}
        if all(values[key] is value for key, value in obj.items()):
            return obj
        return values
    return obj


def _large_bytes_near(obj: Any) -> bool:
    """Is there a large ``bytes`` or ``bytearray`` in ``obj``, or among the
    first items of a tuple or list in it, two levels down (a job's ``(args,
    kwargs)``: its arguments)? A look cheap enough for every push."""
    t = type(obj)
    if t is bytes or t is bytearray:
        return len(obj) >= OOB_BYTES
    if t is not tuple and t is not list:
        return False
    for item in obj[:8]:
        u = type(item)
        if u is bytes or u is bytearray:
            if len(item) >= OOB_BYTES:
                return True
        elif u is tuple or u is list:
            for inner in item[:8]:
                if (type(inner) is bytes or type(inner) is bytearray) and len(inner) >= OOB_BYTES:
                    return True
    return False


def dumps_oob(
    obj: Any, fallback: Callable[..., bytes], main_by_value: bool = False
) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """Pickle ``obj`` with its buffers out of band when they come to
    ``OOB_BYTES`` or more in all: the pickle and the buffers it left out (in
    order; none when they are fewer bytes, kept in the pickle then).
    ``fallback(obj, buffer_callback=...)`` pickles what the standard pickler
    refuses (cloudpickle), and, with ``main_by_value``, a pickle that names
    the main module (``_wire.main_by_value``); raises what it raises.

    The common case, a small value without buffers, costs one ``pickle.dumps``
    with a ``buffer_callback``: the cheapest that still sees every buffer. A
    large pickle is looked into (``_lift``, a few levels deep) for large
    ``bytes`` values, and pickled again only if it holds some."""
    buffers: list[pickle.PickleBuffer] = []
    how: Callable[..., bytes] = _dumps_plain
    if _large_bytes_near(obj):  # lifted before the first pickle, not after a copy of them in band
        obj = _lift(obj)
    try:
        data = pickle.dumps(obj, 5, buffer_callback=buffers.append)
    except Exception:
        how = _dumps_buffers
        try:
            buffers = []
            data = _dumps_buffers(obj, buffer_callback=buffers.append)
        except Exception:
            how = fallback
    else:
        if len(data) >= OOB_BYTES:
            lifted = _lift(obj)
            if lifted is not obj:
                buffers = []
                data = pickle.dumps(lifted, 5, buffer_callback=buffers.append)
    if main_by_value and how is not fallback and MAIN in data:
        how = fallback
    if how is fallback:
        buffers = []
        data = fallback(obj, buffer_callback=buffers.append)
    if buffers and sum(buffer.raw().nbytes for buffer in buffers) < OOB_BYTES:
        return how(obj, buffer_callback=_in_band), []  # too few bytes to be worth a segment
    return data, buffers


def _dumps_plain(obj: Any, buffer_callback: Callable[[pickle.PickleBuffer], Any]) -> bytes:
    return pickle.dumps(obj, 5, buffer_callback=buffer_callback)


def _in_band(buffer: pickle.PickleBuffer) -> bool:
    return True


def _dumps_buffers(obj: Any, buffer_callback: Callable[[pickle.PickleBuffer], Any]) -> bytes:
    out = io.BytesIO()
    _BufferPickler(out, 5, buffer_callback=buffer_callback).dump(obj)
    return out.getvalue()


def dumps_in_band(obj: Any, fallback: Callable[..., bytes], main_by_value: bool = False) -> bytes:
    """Pickle ``obj`` with every buffer in the stream (a ``memoryview`` too);
    ``fallback`` and ``main_by_value`` as for ``dumps_oob``."""
    try:
        data = pickle.dumps(obj, 5)
    except Exception:
        try:
            data = _dumps_buffers(obj, buffer_callback=_in_band)
        except Exception:
            return fallback(obj)
    if main_by_value and MAIN in data:
        return fallback(obj)
    return data
