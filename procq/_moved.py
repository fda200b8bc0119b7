"""Old module names of public classes, answered where the classes live now.

A pickle names a class by the module that defines it. Pickles made before
procq's modules moved into subpackages (a ``Failure`` or an output kept in a
file, a ``Job`` sent to a worker of an older install) name modules such as
``procq._values``. ``install()`` adds a finder, consulted after every real
one, that answers those names with a module looking each attribute up in the
class's new home, so such pickles still load.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "install"]

#: Each old module that defined a public class, and where its names live now.
MOVED: dict[str, tuple[str, ...]] = {
    "procq._dask_lane": ("procq._cluster.lane",),
    "procq._errors": ("procq._model.errors",),
    "procq._executor": ("procq._api.executor",),
    "procq._executor_calls": ("procq._api.executor_calls",),
    "procq._futures": ("procq._api.futures",),
    "procq._handle": ("procq._api.handle",),
    "procq._job": ("procq._model.job", "procq._model.policies"),
    "procq._queue": ("procq._api.queue",),
    "procq._store": ("procq._stores.base",),
    "procq._store_postgres": ("procq._stores.postgres",),
    "procq._store_sqlite": ("procq._stores.sqlite",),
    "procq._values": ("procq._model.values", "procq._api.outcomes"),
}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in MOVED else None

    def exec_module(self, module: ModuleType) -> None:
        homes = MOVED[module.__name__]

        def __getattr__(name: str) -> Any:
            for home in homes:
                found = getattr(importlib.import_module(home), name, _MISSING)
                if found is not _MISSING:
                    return found
            raise AttributeError(f"module {module.__name__!r} (now {', '.join(homes)}) has no attribute {name!r}")

        module.__getattr__ = __getattr__  # type: ignore[method-assign]


_MISSING = object()


def install() -> None:
    """Add the finder once; real modules are always found first."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
