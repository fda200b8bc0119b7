"""The program's main module, imported once in the forkserver procq starts,
so that no worker forked from it imports it again.

Why: under the forkserver and spawn start methods, every new process runs
the program's main script again (as ``__mp_main__``, so that what it
defines unpickles there), with every import in it: a worker start, and so
each replacement of a crashed worker, costs a second run of the script's top
level. The forkserver was meant to do that once, itself, when ``"__main__"``
is on its preload list, but from Python 3.4 until the fix of 3.13's last
releases and 3.14 it never did (it looks for a key, ``main_path``, that its
caller never sets). procq does it on every Python.

How the server learns what to import: the forkserver's only input is its
list of modules to preload, each imported by name, in order, and any
``ImportError`` ignored. The supervisor (``_api.config.main_request``) puts on that list one name under this module
that carries, hex-encoded, what ``multiprocessing.spawn`` would tell a child
of the main module (its path or module name, ``sys.argv``, ``sys.path``).
Importing that name imports this module first, which makes itself a package
and puts a finder on ``sys.meta_path``; the finder decodes the name, and its
loader imports the main module as spawn does (``_import_main``), leaving the
name an empty module. A child forked from the server then finds ``__main__`` already set
up (spawn's ``prepare`` checks the path or module name and leaves it alone).

When the main module cannot be imported there (its top level raises, or
exits), the server is left as it was and ``fallback`` says why: each worker
then imports it itself, as before, and tells the supervisor why with its
READY (``_worker.trusted``), which logs it at DEBUG. A program with no main file
(``python -c``, a REPL, a script read from stdin) has nothing to import:
the supervisor logs that itself.

Only the forkserver and its children import this module (it puts its
finder on their ``sys.meta_path``); a worker reads ``fallback`` only if the
module is there.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["MARK", "fallback"]

#: Why the main module was asked for and not imported in this forkserver
#: (None: it was, or it was not asked for). Forked children inherit it.
fallback: str | None = None

#: True while the server imports the main module.
importing = False

#: A package, so that the import system asks the finder for names under it.
__path__: list[str] = []

#: The first characters of a request's name, after this module's name and a dot.
MARK = "main_"


def _import_main(data: dict[str, Any]) -> None:
    """In the forkserver: import the main module as ``multiprocessing.spawn``
    would in each child, with the program's ``sys.argv`` and ``sys.path``."""
    global fallback
    from multiprocessing import process, spawn, util

    from procq._worker.unguarded import flush_std

    main = sys.modules.get("__main__")
    what = data.get("file") or data.get("name")
    if data.get("file") is not None and getattr(main, "__file__", None) == data["file"]:
        return  # this Python's forkserver imported it already (3.14, and 3.13's last releases)
    if data.get("name") is not None and getattr(getattr(main, "__spec__", None), "name", None) == data["name"]:
        return
    if data.get("path") is not None:
        sys.path = list(data["path"])
    sys.argv = list(data["argv"])
    # As the server does after its preloads, and as a child's stdin is: a
    # script's top level that reads stdin must not wait on the terminal's.
    util._close_stdin()  # type: ignore[attr-defined]
    current: Any = process.current_process()
    current._inheriting = True  # as in a spawned child: a script that starts processes unguarded is told so
    global importing
    importing = True  # (read by _worker.unguarded: a queue opened now raises, the server lives on)
    try:
        if data.get("file") is not None:
            spawn.import_main_path(data["file"])
        else:
            spawn._fixup_main_from_name(data["name"])  # type: ignore[attr-defined]
    except BaseException as exc:  # SystemExit, KeyboardInterrupt: the script's, not the server's
        sys.modules["__main__"] = main  # type: ignore[assignment]
        sys.modules.pop("__mp_main__", None)
        fallback = f"importing {what} raised {type(exc).__name__}: {_describe(exc)}"
    finally:
        importing = False
        del current._inheriting
        # What the script printed must not be printed again by each child
        # that inherits the unflushed buffer.
        flush_std()


def _describe(exc: BaseException) -> str:
    try:
        return str(exc)[:200]
    except BaseException:
        return "(its message could not be read)"


class _MainLoader(importlib.abc.Loader):
    """Imports the main module as it "executes" the request's module, which
    is left empty. Here, not in the finder: the import system calls finders
    with its global lock held, and the script's top level must not run with
    that lock (a thread it starts and waits for could not import anything)."""

    def __init__(self, data: dict[str, Any] | None) -> None:
        self.data = data

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        if self.data is not None:
            _import_main(self.data)


class _Finder(importlib.abc.MetaPathFinder):
    """Answers the request's name (and no other) with ``_MainLoader``."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        prefix = f"{__name__}.{MARK}"
        if not fullname.startswith(prefix):
            return None
        global fallback
        data: dict[str, Any] | None = None
        try:
            data = json.loads(bytes.fromhex(fullname[len(prefix) :]))
        except ValueError as exc:  # pragma: no cover - only procq writes these names
            fallback = f"the request to import it could not be read: {exc}"
        return importlib.machinery.ModuleSpec(fullname, _MainLoader(data))


sys.meta_path.insert(0, _Finder())
