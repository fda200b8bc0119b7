"""What travels on a worker's pipe, and how it is framed.

Each worker has its own duplex ``multiprocessing`` pipe; nothing is shared
between workers. Every message is one ``send_bytes`` frame holding a pickled
tuple. The job's function, arguments and result travel inside it as separate,
already-pickled ``bytes``, so a payload that fails to unpickle on the far side
fails only that job and never hides which job it belonged to.

Supervisor -> worker::

    (RUN, job_id, fn_id, fn_bytes | None, args_bytes)

``fn_id`` is a digest of ``fn_bytes``. The bytes are sent only the first time
a worker sees that digest; the worker keeps the unpickled function in an LRU of
``FN_CACHE_SIZE`` entries, and the supervisor keeps an exact mirror of that LRU
per worker (:class:`FnMirror`), so both sides always agree on what the worker
holds without ever asking. Because the id is the content, a closure whose
captured values changed since its last push is simply a new function.

Worker -> supervisor::

    (0, READY)                         once, when it is set up and takes jobs
    (job_id, OK, result_bytes)
    (job_id, ERROR, exc_bytes | None, exc_type, message, traceback_text)

A worker that dies sends nothing: the supervisor learns of it from the
process sentinel and EOF on the pipe, and knows which job it held because it
gave it that job.
"""

from __future__ import annotations

import hashlib
import pickle
import sys
from collections import OrderedDict
from typing import Any

__all__ = [
    "ERROR",
    "FN_CACHE_SIZE",
    "OK",
    "READY",
    "RUN",
    "FnMirror",
    "digest",
    "dumps",
    "dumps_fn",
    "pickled_by_reference",
]

RUN = 0
OK = 1
ERROR = 2
READY = 3

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


def digest(data: bytes) -> bytes:
    """The id of a pickled function: equal bytes, equal id."""
    return hashlib.blake2b(data, digest_size=16).digest()


def pickled_by_reference(fn: Any) -> bool:
    """True when cloudpickle pickles ``fn`` as a reference to an importable,
    module-level function, so its pickle never changes and can be kept.

    Anything else (lambdas, closures, local functions, ``__main__``'s
    functions, modules registered for pickling by value) is pickled by value:
    its bytes capture current values and must be made again at every push.
    """
    module_name = getattr(fn, "__module__", None)
    if not module_name or module_name == "__main__":
        return False
    import cloudpickle

    by_value = getattr(cloudpickle.cloudpickle, "_PICKLE_BY_VALUE_MODULES", ())
    if module_name in by_value or module_name.split(".")[0] in by_value:
        return False
    obj: Any = sys.modules.get(module_name)
    for part in getattr(fn, "__qualname__", "<locals>").split("."):
        if obj is None or part == "<locals>":
            return False
        obj = getattr(obj, part, None)
    return obj is fn


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
        self._held: OrderedDict[bytes, Any] = OrderedDict()
        self._size = size

    def touch(self, fn_id: bytes, value: Any = None) -> bool:
        held = self._held
        if fn_id in held:
            held.move_to_end(fn_id)
            return True
        held[fn_id] = value
        if len(held) > self._size:
            held.popitem(last=False)
        return False

    def get(self, fn_id: bytes) -> Any:
        return self._held[fn_id]
