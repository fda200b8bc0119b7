"""When what the program's main module defines must cross to a worker by value.

``pickle`` sends a class or function by reference, as its module's name and
its own: ``__main__.Config``. The worker then looks ``Config`` up in its own
``__main__``, which holds it only when the worker imported the program's
main module, as a trusted local worker does (``multiprocessing.spawn``'s way,
done once in procq's forkserver) when the program has a main it can import:
a script file, or a module run with ``python -m pkg.mod``.

Nothing else has one to import. A notebook's or a REPL's namespace, ``python
-c``, a script read from stdin, a zipapp's ``__main__`` and a package's
``__main__`` (``python -m pkg``) leave the worker's ``__main__`` without the
program's names; so do workers that never import it: an untrusted (sandboxed)
lane's, and a remote (Dask) lane's. For those, a pickle that names
``__main__`` is made again with cloudpickle, which sends what ``__main__``
defines by value (the class or function itself, as loky does), wherever it
sits in the arguments. The bytes ``__main__`` are looked for in the pickle,
not walked for in the object: one scan at memory speed, and plain data (the
common case) pays nothing more. A string that happens to hold them costs one
cloudpickle, never a wrong answer.

A worker's results and exceptions need nothing of this: a class the worker
got by value is not in its ``__main__``, so plain pickle refuses it there and
cloudpickle (the fallback of every pickle procq makes) sends it back by value;
cloudpickle's tracking of the classes it sends makes the supervisor's copy
the program's own class again, so ``except MyError`` catches it.
"""

from __future__ import annotations

import os
import sys

__all__ = ["MAIN", "main_imported_by_workers"]

#: What a pickle holds when it names something of the main module by reference.
MAIN = b"__main__"


def main_imported_by_workers() -> bool:
    """True when a trusted local worker imports this program's main module as
    ``multiprocessing.spawn`` would, so what it defines at its top level
    unpickles there by reference.

    A module run with ``-m`` (other than a package's ``__main__``) is
    imported by name; otherwise the main module's file is run, when it is
    one (not ``<stdin>``, nor a path inside a zipapp). Asked at every push:
    the answer is kept for as long as ``__main__`` is the same module."""
    global _known
    main = sys.modules.get("__main__")
    known = _known
    if known is not None and known[0] is main:
        return known[1]
    answer = _imported(main)
    _known = (main, answer)
    return answer


_known: tuple[object, bool] | None = None


def _imported(main: object) -> bool:
    if main is None:
        return False
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        return bool(name != "__main__" and not name.endswith(".__main__"))
    path = getattr(main, "__file__", None)
    return isinstance(path, str) and os.path.isfile(path)
