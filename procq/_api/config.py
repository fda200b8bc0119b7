"""What ``ProcQueue``'s constructor takes, checked: its lanes, its policies and the workers' start method."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from collections.abc import Mapping
from typing import Any

from procq._model.job import REUSE_POLICIES, Lane
from procq._model.policies import Retention
from procq._supervisor.log import main_not_preloaded
from procq._system.privileges import make_untraceable

__all__ = [
    "MISMATCH_POLICIES",
    "check_monitor",
    "check_policies",
    "main_request",
    "parse_lanes",
    "preload_also",
    "preload_worker",
    "worker_context",
]

#: What a push does when its key's holder has other work (see ``ProcQueue``).
MISMATCH_POLICIES = ("raise", "warn", "ignore")


#: What a forkserver child imports before it reaches procq's code, when
#: the server has not (see ``preload_worker``).
_CHILD_IMPORTS = ("multiprocessing.popen_forkserver", "multiprocessing.popen_fork", "runpy", "pkgutil")

#: procq's own modules that want to be on the forkserver's preload list too,
#: in the order asked (``preload_also``): what their jobs need imported.
_ALSO_PRELOADED: list[str] = []


def preload_also(module: str) -> None:
    """Have the forkserver procq starts import ``module`` too (say, the joblib
    backend: every worker of a ``Parallel`` call would import joblib to
    unpickle its first batch, a tenth of a second, paid again by each call's
    fresh workers). Only until the forkserver has started; harmless after."""
    if module not in _ALSO_PRELOADED:
        _ALSO_PRELOADED.append(module)


def parse_lanes(lanes: int | Mapping[str, int | Lane] | None) -> dict[str, Lane]:
    """Every lane by name, in order: one ``"default"`` lane for an int, a
    ``Lane`` or None (as many workers as CPUs), or the mapping's."""
    if lanes is None:
        return {"default": Lane(workers=multiprocessing.cpu_count())}
    if isinstance(lanes, bool):
        raise TypeError("lanes must be an int or a mapping of lane names to int or Lane, got bool")
    if isinstance(lanes, int):
        if lanes < 1:
            raise ValueError(f"lanes={lanes}: a queue needs at least 1 worker")
        return {"default": Lane(workers=lanes)}
    if isinstance(lanes, Lane):
        return {"default": lanes}
    if not isinstance(lanes, Mapping):
        raise TypeError(f"lanes must be an int or a mapping of lane names to int or Lane, got {type(lanes).__name__}")
    if not lanes:
        raise ValueError("lanes must name at least one lane")
    parsed: dict[str, Lane] = {}
    for name, spec in lanes.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"lane names must be non-empty str, got {name!r}")
        if isinstance(spec, Lane):
            parsed[name] = spec
        elif isinstance(spec, int) and not isinstance(spec, bool):
            if spec < 1:
                raise ValueError(f"lane {name!r} needs at least 1 worker, got {spec}")
            parsed[name] = Lane(workers=spec)
        else:
            raise TypeError(f"lane {name!r}: expected an int or a Lane, got {type(spec).__name__}")
    return parsed


def check_policies(retention: Any, reuse: Any, on_mismatch: Any) -> None:
    if retention is not None and not isinstance(retention, Retention):
        raise TypeError(f"retention must be a procq.Retention or None, got {type(retention).__name__}")
    if reuse not in REUSE_POLICIES:
        raise ValueError(f"reuse must be 'failed', 'always' or 'never', got {reuse!r}")
    if on_mismatch not in MISMATCH_POLICIES:
        raise ValueError(f"on_mismatch must be 'raise', 'warn' or 'ignore', got {on_mismatch!r}")


def check_monitor(name: Any, monitor: Any) -> None:
    """``ProcQueue(name=..., monitor=...)``: the name its metrics and ``procq top``
    show (it names the monitor's socket too), and whether it serves snapshots."""
    if name is not None:
        if not isinstance(name, str):
            raise TypeError(f"a queue's name is a str, got {type(name).__name__}: {name!r}")
        if not name or "\0" in name or "/" in name:
            raise ValueError(f"a queue's name must be non-empty, without '/' or NUL, got {name!r}")
    if type(monitor) is not bool:
        raise TypeError(f"monitor must be True or False, got {type(monitor).__name__}: {monitor!r}")


def worker_context(start_method: str | None, lanes: Mapping[str, Lane]) -> tuple[str, Any]:
    """The start method workers use (``"forkserver"`` on Linux and
    ``"spawn"`` elsewhere by default) and its ``multiprocessing`` context.

    A queue with an untrusted lane makes this whole process untraceable first
    (``_system.privileges.make_untraceable``): jobs of that lane run as the same
    user, and must not reach its memory, environment or descriptors, nor
    those of the trusted workers it starts from now on."""
    # forkserver forks workers from a clean single-threaded server, so the
    # supervisor's own threads are never duplicated into a child; it exists on
    # Linux. Elsewhere spawn is the safe choice.
    method = start_method or ("forkserver" if sys.platform.startswith("linux") else "spawn")
    if method == "fork":
        # The supervisor runs a thread, and a fork copies a threaded process
        # with its locks held mid-use; the child would also inherit every
        # other worker's pipe, so no worker would see EOF when it should.
        raise ValueError(
            "start method 'fork' is not supported: the supervisor runs a thread, and forking "
            "a threaded process can deadlock the child; use 'forkserver' or 'spawn'"
        )
    try:
        context = multiprocessing.get_context(method)
    except ValueError:
        known = ", ".join(multiprocessing.get_all_start_methods())
        raise ValueError(f"unknown start method {method!r}; this platform has {known}") from None
    inherited = multiprocessing.get_start_method(allow_none=True)
    if inherited is not None and inherited not in multiprocessing.get_all_start_methods():
        # Every child started from here (by spawn or by the forkserver) is told
        # to set this process's own start method as it starts, and dies there.
        raise RuntimeError(
            f"this process's multiprocessing start method is {inherited!r}, which the standard library does not "
            f"know (a loky worker's, say): every process started from here would die looking for it, whatever "
            f"start method procq uses; open the ProcQueue in a process with a standard start method"
        )
    if any(not lane.trusted for lane in lanes.values()):
        make_untraceable()
    skip_missing_main_file()
    if method == "forkserver":
        preload_worker(context)
    return method, context


def skip_missing_main_file() -> None:
    """Keep every child started from here (procq's workers, and the rest)
    from running a main "file" that does not exist.

    ``multiprocessing.spawn`` tells each child to run the main module's
    ``__file__``, and a child dies at its start when that is no file: a
    script read from stdin has ``<stdin>`` there (joined to the current
    directory), and an embedding program may set anything. A child has
    nothing to import then, as for ``python -c``: the preparation data each
    child gets leaves the path out. Done once per process, only when the
    main module names a missing file, and only for a path that is missing
    when a child starts."""
    from multiprocessing import spawn

    path = getattr(sys.modules.get("__main__"), "__file__", None)
    original = spawn.get_preparation_data
    if not isinstance(path, str) or os.path.isfile(path) or getattr(original, "_procq_wrapped", False):
        return

    def get_preparation_data(name: str) -> dict[str, Any]:
        data: dict[str, Any] = original(name)
        path = data.get("init_main_from_path")
        if path is not None and not os.path.isfile(path):
            del data["init_main_from_path"]
        return data

    get_preparation_data._procq_wrapped = True  # type: ignore[attr-defined]
    spawn.get_preparation_data = get_preparation_data


def preload_worker(context: Any) -> None:
    """Have the forkserver import procq and the program's main module before
    it forks, so that every worker starts with them loaded. Only until the
    forkserver has started, which is once per process; the modules already
    asked for are kept.

    The main module (``_worker.forkserver_main``): without it, each worker would
    import the main script again as it starts (as ``__mp_main__``), with
    every import in it. It is imported last, after procq, which it most
    likely imports itself.

    Also on the list, what each child would otherwise import on its own
    before it runs a line of procq (milliseconds per worker, every one paid
    again by each replacement of a crashed worker): the ``Popen`` classes
    its pickled ``Process`` names, and ``runpy`` and ``pkgutil``, with which
    it would import the main module should the server have failed to; and
    ``cloudpickle``, which unpickles every function sent by value: the main
    module's own (most programs' jobs), lambdas and closures.

    First on the list, ``_worker.forkserver_guard`` makes the server untraceable and
    has it fork only for its parent. A forkserver started by someone else
    before this runs has neither (see docs/untrusted.md), nor the main module.
    """
    try:
        from multiprocessing import forkserver

        server: Any = forkserver._forkserver  # private: no public way to read the list
        running = server._forkserver_pid is not None
        modules = list(server._preload_modules)
    except Exception:  # pragma: no cover - the stdlib's internals changed
        return
    if running:
        if not any(m.startswith(_MAIN_REQUEST) for m in modules):
            _not_preloaded("the forkserver was started before this process's first queue, without procq's preloads")
        return
    guard = "procq._worker.forkserver_guard"
    # A request left by an earlier queue of this process is made again, as
    # things are now. "__main__" is left off: a Python whose forkserver imports the main
    # module itself would do it first, before the guard, and without the
    # program's sys.argv before 3.14; procq's request does it on every Python.
    drop = {guard, "__main__"}
    modules = [m for m in modules if m not in drop and not m.startswith(_MAIN_REQUEST)]
    main = main_request()
    wanted = [
        m for m in (*_CHILD_IMPORTS, "procq._worker.trusted", "procq._api.queue", "cloudpickle", *_ALSO_PRELOADED)
    ]
    wanted = [m for m in wanted if m not in modules]
    context.set_forkserver_preload([guard, *modules, *wanted, *([main] if main else [])])


#: The start of the module name that has the forkserver import the main
#: module (see ``_worker.forkserver_main``).
_MAIN_REQUEST = "procq._worker.forkserver_main.main_"
#: Past this many characters of arguments and import path, the request is not
#: made: the whole preload list travels to the forkserver in one command-line
#: argument, which Linux caps at 128 KiB.
_MAX_REQUEST = 32 * 1024


def main_request() -> str | None:
    """The module name that has the forkserver import the program's main
    module as ``multiprocessing.spawn`` would in each child (its path or
    module name, ``sys.argv``, ``sys.path``), or None: there is none to
    import, or it cannot be asked for (logged at DEBUG, once)."""
    from multiprocessing import spawn

    # Raises RuntimeError while this process imports its main module as a
    # child does (a forkserver, or a worker, running a script whose queue is
    # not under its ``if __name__ == "__main__":`` guard), as any start of a
    # process there does: the queue is refused, and so is that import.
    preparation = spawn.get_preparation_data("procq")
    data: dict[str, Any] = {"argv": list(preparation.get("sys_argv", ())), "path": preparation.get("sys_path")}
    name = preparation.get("init_main_from_name")
    path = preparation.get("init_main_from_path")
    if name is not None:
        if name == "__main__" or name.endswith(".__main__"):
            # A package's __main__ (python -m pkg): spawn runs none of it in a
            # child, so there is nothing to import once either.
            return None
        data["name"] = name
    elif path is not None:
        data["file"] = path
    else:
        return _not_preloaded("the program has no main file (python -c, a REPL, or a script read from stdin)")
    encoded = json.dumps(data).encode().hex()
    if len(encoded) > _MAX_REQUEST:
        return _not_preloaded(f"its sys.argv and sys.path take {len(encoded) // 2} bytes, too many to pass on")
    return _MAIN_REQUEST + encoded


def _not_preloaded(why: str) -> str | None:
    main_not_preloaded(why)
    return None
