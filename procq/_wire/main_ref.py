"""A function of the main script, sent to a lane with an initializer by name.

procq sends a function defined in the program's main script by value
(cloudpickle): the worker gets a copy with the values, at push time, of the
globals it reads, and no two such copies share a global. That keeps a job
that reads what the program set under its ``if __name__ == "__main__":``
guard working; but a lane's ``initializer`` exists to set up globals for the
lane's jobs, and a copy would never see them.

So for a lane with an initializer, a top-level function of the main module
(the initializer and the jobs alike) travels by name and by value
(``dumps_shared``). A worker that imported the main module (a trusted lane's
worker does, under the forkserver or spawn, when the program has a main
file) runs the function its own main module defines, whose globals are that
module's, shared with the initializer, as ``ProcessPoolExecutor``'s workers
do; one that did not (``python -c``, a package's ``__main__``, a function
defined under the guard) unpickles the copy (``from_main``).
"""

from __future__ import annotations

import pickle
import sys
import types
from typing import Any

from procq._wire.protocol import PROTOCOL, dumps_fn

__all__ = ["dumps_shared", "from_main"]


class _FromMain:
    __slots__ = ("by_value", "qualname")

    def __init__(self, qualname: str, by_value: bytes) -> None:
        self.qualname = qualname
        self.by_value = by_value

    def __reduce__(self) -> tuple[Any, ...]:
        return (from_main, (self.qualname, self.by_value))


def from_main(qualname: str, by_value: bytes) -> Any:
    """In a worker: the main module's own ``qualname`` if it has one, else the copy."""
    main = sys.modules.get("__main__")
    fn = getattr(main, qualname, None) if main is not None else None
    if isinstance(fn, types.FunctionType) and fn.__module__ in ("__main__", "__mp_main__"):
        return fn
    return pickle.loads(by_value)


def dumps_shared(fn: Any) -> bytes:
    """Pickle ``fn`` for a lane with an initializer: a top-level function of
    the main module by name and by value, anything else as ``dumps_fn`` does."""
    data = dumps_fn(fn)
    if type(fn) is not types.FunctionType or fn.__module__ != "__main__":
        return data
    qualname = fn.__qualname__
    if getattr(sys.modules.get("__main__"), qualname, None) is not fn:  # nested, or defined under another name
        return data
    return pickle.dumps(_FromMain(qualname, data), PROTOCOL)
