"""How a trusted worker follows its supervisor's life: it exits when the
supervisor dies, and only then (see ``die_with_parent``)."""

from __future__ import annotations

import _thread
import contextlib
import os
from typing import Any

from procq._system.privileges import set_pdeathsig

__all__ = ["die_with_parent", "drop_forkserver_alive_fd", "parent_process"]


def die_with_parent(sentinel: Any = None) -> None:
    """Make this process exit when the supervisor does, however it dies.

    Three layers, because each covers a case the others miss:

    - A thread blocked on the parent sentinel: a pipe whose write end only
      the supervisor holds (``multiprocessing`` makes it for every start
      method), so it reaches EOF the moment the supervisor dies, even while
      the main thread is deep in a job's native code.
    - ``PR_SET_PDEATHSIG`` on Linux: the kernel SIGKILLs this process when its
      parent dies: the supervisor under spawn, the forkserver under forkserver.
    - Dropping the forkserver's "alive" pipe, which every forkserver child
      inherits: while any child holds it, the forkserver cannot see that the
      supervisor died, and lives on (with its children) forever.
    """
    if sentinel is None:
        parent = parent_process()
        sentinel = None if parent is None else parent.sentinel
    drop_forkserver_alive_fd()
    with contextlib.suppress(Exception):  # an exotic libc
        set_pdeathsig()
    if sentinel is None:  # pragma: no cover - always set by multiprocessing
        return

    def watch() -> None:
        # Only EOF is the parent's death: bytes someone wrote into the pipe are
        # read and dropped.
        try:
            while os.read(sentinel, 4096):
                pass
        except OSError:
            pass
        os._exit(1)

    # Started after prctl: a parent that died before it took effect is seen
    # here. A bare thread: ``threading.Thread.start`` waits until the new
    # thread runs, a thread switch every worker start (and every replacement
    # of a crashed worker) would pay for nothing.
    _thread.start_new_thread(watch, ())


def drop_forkserver_alive_fd() -> None:
    try:
        from multiprocessing import forkserver

        server: Any = forkserver._forkserver  # private: no public way to do this
        fd = server._forkserver_alive_fd
    except Exception:  # pragma: no cover - the stdlib's internals changed
        return
    if fd is not None:
        try:
            os.close(fd)
        except OSError:  # pragma: no cover
            pass
        # Should a job use the forkserver itself, it starts one of its own.
        server._forkserver_alive_fd = None
        server._forkserver_address = None
        server._forkserver_pid = None


def parent_process() -> Any:
    import multiprocessing

    return multiprocessing.parent_process()
