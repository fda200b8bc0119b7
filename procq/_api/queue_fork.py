"""What a child made with ``os.fork()`` does with its parent's queues: the
at-fork hook that disowns them (see ``_api.queue``) and forgets the parent's
forkserver."""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import sys
import threading
import weakref
from typing import Any

__all__ = ["queues"]

#: How a trusted worker's process is named (``_supervisor.channel_trusted``).
_WORKER_NAME = "procq-worker-"
#: Every queue of this process, for the at-fork hook below.
queues: weakref.WeakSet[Any] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for q in list(queues):
        q._disown()
    _forget_parents_forkserver()
    _release_resource_tracker_lock()
    # multiprocessing's exit handler joins every process in its list of
    # children (and terminates the daemonic ones); the child's copy of that
    # list names the parent's trusted workers, and reading their sentinels
    # from here could take an exit status the parent waits for.
    children: set[Any] = multiprocessing.process._children  # type: ignore[attr-defined]
    for process in list(children):
        if process.name.startswith(_WORKER_NAME):
            children.discard(process)


def _forget_parents_forkserver() -> None:
    """A forked child inherits its parent's record of multiprocessing's
    forkserver, a process that is not the child's own child: a queue opened in
    the child would fail to start workers through it (``os.waitpid`` of a
    process that is not its child), or hang on a lock a thread of the parent
    held at the fork. Forget it (closing only the child's copy of the
    descriptor that keeps it alive), so the child starts a forkserver of its own."""
    module = sys.modules.get("multiprocessing.forkserver")
    server = getattr(module, "_forkserver", None)
    if getattr(server, "_forkserver_pid", None) is None:
        return
    try:  # private: no public way to do this
        alive = server._forkserver_alive_fd  # type: ignore[union-attr]
        server._lock = threading.Lock()  # type: ignore[union-attr]
        server._forkserver_pid = server._forkserver_address = server._forkserver_alive_fd = None  # type: ignore[union-attr]
    except AttributeError:  # pragma: no cover - the stdlib's internals changed
        return
    if alive is not None:
        with contextlib.suppress(OSError):
            os.close(alive)


def _release_resource_tracker_lock() -> None:
    """A forked child inherits multiprocessing's resource tracker's lock as
    it was: held, if a thread of the parent was inside the tracker at the
    fork (a queue's starter thread asks it at every worker start). The
    child's own first thread may then get that thread's identity, and its
    first call into the tracker fails as reentrant (``ReentrantCallError``),
    or another of its threads waits forever. Nothing in the child holds it:
    give the child's copy a fresh lock."""
    module = sys.modules.get("multiprocessing.resource_tracker")
    tracker = getattr(module, "_resource_tracker", None)
    if tracker is not None and hasattr(tracker, "_lock"):
        tracker._lock = threading.RLock()  # private: no public way to do this


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
