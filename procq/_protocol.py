"""What travels on a worker's pipe, and how it is framed.

Each worker has its own duplex ``multiprocessing`` pipe; nothing is shared
between workers. Every message is one ``send_bytes`` frame holding a pickled
tuple. The job's function, arguments and result travel inside it as separate,
already-pickled ``bytes``, so a payload that fails to unpickle on the far side
fails only that job and never hides which job it belonged to.

Supervisor -> worker::

    (RUN, job_id, fn_id, fn_bytes | None, args_bytes)

``fn_bytes`` is sent only the first time a worker sees ``fn_id``; the worker
keeps the unpickled function in an LRU of ``FN_CACHE_SIZE`` entries, and the
supervisor keeps an exact mirror of that LRU per worker (:class:`FnMirror`), so
both sides always agree on what the worker holds without ever asking.

Worker -> supervisor::

    (job_id, OK, result_bytes)
    (job_id, ERROR, exc_bytes | None, exc_type, message, traceback_text)

A worker that dies sends nothing: the supervisor learns of it from the
process sentinel and EOF on the pipe, and knows which job it held because it
gave it that job.
"""

from __future__ import annotations

import pickle
from collections import OrderedDict
from typing import Any

__all__ = ["ERROR", "FN_CACHE_SIZE", "OK", "RUN", "FnMirror", "dumps", "dumps_fn"]

RUN = 0
OK = 1
ERROR = 2

#: How many distinct functions a worker keeps unpickled.
FN_CACHE_SIZE = 128

PROTOCOL = pickle.HIGHEST_PROTOCOL


def dumps(obj: Any) -> bytes:
    """Pickle ``obj`` for the other side of a worker pipe.

    The standard pickler is tried first because it is several times faster on
    plain data; cloudpickle is the fallback for what it cannot do (lambdas,
    closures, local classes). Raises whatever cloudpickle raises when neither
    can pickle ``obj``.
    """
    try:
        return pickle.dumps(obj, PROTOCOL)
    except Exception:
        return dumps_fn(obj)


def dumps_fn(fn: Any) -> bytes:
    """Pickle with cloudpickle, which sends lambdas and closures by value.

    Imported here, not at module level, so that a worker that never needs it
    (most results are plain data) starts without it.
    """
    import cloudpickle

    data: bytes = cloudpickle.dumps(fn, PROTOCOL)
    return data


class FnMirror:
    """An LRU of function ids, kept identically by a worker and by the supervisor.

    ``touch(fn_id)`` returns True when the id was already held (so its bytes
    need not be sent) and records the use; both sides call it once per job, in
    the same order, so their LRUs never diverge.
    """

    __slots__ = ("_held", "_size")

    def __init__(self, size: int = FN_CACHE_SIZE) -> None:
        self._held: OrderedDict[int, Any] = OrderedDict()
        self._size = size

    def touch(self, fn_id: int, value: Any = None) -> bool:
        held = self._held
        if fn_id in held:
            held.move_to_end(fn_id)
            return True
        held[fn_id] = value
        if len(held) > self._size:
            held.popitem(last=False)
        return False

    def get(self, fn_id: int) -> Any:
        return self._held[fn_id]
