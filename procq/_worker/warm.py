"""Learned warm starts: a trusted lane remembers the modules its jobs needed
and has its template (``_worker.template``) import them, so that every
replacement and spare it forks starts with them.

Why: a worker imports the modules of a job's function and arguments the
first time it unpickles them, and a replacement of a crashed worker does it
all again: a job module that imports numpy and scipy costs each new worker
about 0.4 s. The forkserver imports what the main script imports at its top,
but a program often imports its jobs' modules later (under the main guard,
after parsing its arguments, in a notebook, under pytest, in ``procq run``),
and few users call ``multiprocessing.set_forkserver_preload``.

How it flows:

- A worker of a lane that learns (``LEARN``: trusted, under the forkserver,
  where templates fork) counts ``sys.modules`` before it unpickles a job and
  after: two ``len`` calls per job. When the count grew, it sends the new
  names (``imported_since``) in an ``IMPORTED`` message before the job's
  report. A function pickled by reference names its module: a worker about
  to import that module says so first (``about_to_import``), so that the
  template imports it alongside the worker rather than after it. New
  entries of ``sys.modules`` are at its end (a dict keeps the order of
  insertion; the import system puts a module back at the end once it has
  run), so the count tells them apart, and importing them in that order
  (a submodule imports its package first) reproduces what the job needed.
- The supervisor keeps them per lane (``Learned``, read on the I/O thread or a
  leading waiter, written there and on the starter thread: one lock), and
  each fork request to the lane's template carries them.
- The template imports the names it has not tried yet (``import_learned``),
  then forks. A worker forked from it finds them in ``sys.modules``, and its
  unpickling imports nothing more.

What goes wrong, and what then:

- An import that raises (``SystemExit`` included) is dropped from the lane's
  list, logged at WARNING on ``procq.worker`` with the error, and never tried
  again by that queue: the worker that needs it imports it itself, as before.
- An import that takes more than ``WARM_TIMEOUT`` (an alarm in the template
  interrupts it) is dropped alike. A template that dies or still does not
  answer (a hang in native code): the names new to it are dropped (one of
  them killed it or hung), the template is killed, and that start goes
  through the forkserver.
- Threads. ``fork()`` copies only the calling thread: a lock another thread
  held stays locked in the child forever, and a thread pool the child expects
  is gone. So a template never forks with a second thread. Before its imports
  it sets the thread-count variables of the common native pools (OpenBLAS,
  OpenMP, MKL, BLIS, Accelerate, numexpr: ``THREAD_VARS``) to 1 where the
  environment does not set them, so that those libraries start no thread as
  they load (OpenBLAS starts its pool at import otherwise), and puts them back
  after. After each import it counts its threads (``/proc/self/task``, which
  sees native ones too); a module after whose import there is more than one
  is dropped and logged, with every module that import brought in (so that
  the next template does not import the culprit again through one of them),
  and the template answers without forking and forks no more (it lives on
  only to report the exits of the workers it forked, which die with it): the
  start goes through the forkserver, and the next start makes a new template
  without those modules. A worker forked from a template therefore starts
  with those native pools sized 1 thread; procq's joblib backend sets each
  worker's pools to its limit again (``threadpoolctl``), and a lane's own
  code can do the same.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable

from procq._wire.protocol import IMPORTED, TRAILER

__all__ = ["LEARN", "THREAD_VARS", "WARM_TIMEOUT", "Learned", "about_to_import", "import_learned", "imported_since"]

#: The key of a worker's config that says its lane learns its jobs' modules.
LEARN = "learn_imports"
#: At most this many names per lane: enough for scikit-learn and its stack.
MAX_NAMES = 8192
#: Names never learned: the main module is the forkserver's business
#: (``_worker.forkserver_main``), and procq's own modules are there already.
_SKIP = frozenset({"__main__", "__mp_main__"})

#: How long the template lets one module take to import before it gives up on it.
WARM_TIMEOUT = 20.0

#: How a module dropped with another one says so (and is not logged on its own).
_ALONG = "imported along with "

#: The variables that size native thread pools as their library loads.
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


# --- in the worker -------------------------------------------------------------


def imported_since(count: int, send: Callable[[bytes], None]) -> None:
    """Send the IMPORTED message for the modules added to ``sys.modules``
    after its first ``count`` entries, if any is worth learning."""
    _send([name for name in list(sys.modules)[count:] if name not in _SKIP and not name.startswith("procq.")], send)


def about_to_import(fn_bytes: bytes, send: Callable[[bytes], None]) -> None:
    """Send the IMPORTED message for the module of a function pickled by
    reference, if this worker has not imported it yet.

    Sent before the worker unpickles the function, so that the template
    imports the module while the worker does, not after: a function pickled
    by reference is a pickle of a dozen opcodes (protocol, frame, the
    module's name, the function's, ``STACK_GLOBAL``), read here by hand
    rather than with ``pickletools``, which would cost each worker its
    import. Anything else is left to ``imported_since``."""
    at = 2 if fn_bytes[:2] == b"\x80\x05" else 0
    if fn_bytes[at : at + 1] == b"\x95":  # FRAME and its 8-byte length
        at += 9
    if len(fn_bytes) > 512 or fn_bytes[at : at + 1] != b"\x8c":  # SHORT_BINUNICODE
        return
    size = fn_bytes[at + 1] if len(fn_bytes) > at + 1 else 0
    module = fn_bytes[at + 2 : at + 2 + size].decode("utf-8", "replace")
    rest = fn_bytes[at + 2 + size :]
    if module and module not in sys.modules and module not in _SKIP and rest[:2] == b"\x94\x8c":
        _send([module], send)


def _send(names: list[str], send: Callable[[bytes], None]) -> None:
    if names:
        send("\n".join(names).encode("utf-8", "replace") + TRAILER.pack(0, IMPORTED))


# --- in the supervisor ---------------------------------------------------------


class Learned:
    """The modules a lane's jobs needed, in the order they were first
    imported, and those dropped (never asked for again)."""

    def __init__(self, lane: str) -> None:
        self.lane = lane
        self._lock = threading.Lock()
        self._names: dict[str, None] = {}  # under _lock; insertion order is import order
        self._dropped: dict[str, str] = {}  # name -> why; under _lock
        # Called (on the thread that learned) when a name is new: asks for the
        # template to import it now (``WorkerChannel.warm``), not at the next start.
        self.on_new: Callable[[], object] | None = None

    def learn(self, payload: bytes | bytearray | memoryview) -> None:
        """Add the names of an IMPORTED message (I/O thread or a leading waiter)."""
        names = bytes(payload).decode("utf-8", "replace").split("\n")
        with self._lock:
            before = len(self._names)
            for name in names:
                if name and name not in self._dropped and len(self._names) < MAX_NAMES:
                    self._names.setdefault(name)
            grew = len(self._names) != before
        if grew and self.on_new is not None:
            self.on_new()

    def names(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._names)

    def dropped(self) -> dict[str, str]:
        with self._lock:
            return dict(self._dropped)

    def drop(self, dropped: Iterable[tuple[str, str]]) -> None:
        """Never ask for these again; say why on ``procq.worker`` (starter thread)."""
        for name, why in dropped:
            with self._lock:
                if name in self._dropped:
                    continue
                self._names.pop(name, None)
                self._dropped[name] = why
            if why.startswith(_ALONG):  # (said once, with the module that was imported first)
                continue
            import logging  # (supervisor side only: a worker that imports this module never logs)

            logging.getLogger("procq.worker").warning(
                "lane %r: its template will not import %r for new workers (%s); each worker imports it itself",
                self.lane,
                name,
                why,
            )


# --- in the template -----------------------------------------------------------


def import_learned(names: Iterable[str], tried: set[str]) -> tuple[list[str], list[tuple[str, str]], bool]:
    """Import each of ``names`` not in ``tried`` (which grows), in order.

    Returns the names now imported, those dropped with why, and whether the
    template has started a thread (then it must not fork: see the module
    docstring)."""
    done: list[str] = []
    dropped: list[tuple[str, str]] = []
    todo = [name for name in names if name not in tried]
    if not todo:
        return done, dropped, False
    pinned = [var for var in THREAD_VARS if var not in os.environ]
    for var in pinned:
        os.environ[var] = "1"
    alarm = signal.signal(signal.SIGALRM, _took_too_long)
    try:
        for name in todo:
            tried.add(name)
            if name in sys.modules:
                done.append(name)
                continue
            count = len(sys.modules)
            signal.setitimer(signal.ITIMER_REAL, WARM_TIMEOUT)
            try:
                importlib.import_module(name)
            except _TookTooLong:
                dropped.append((name, f"importing it took more than {WARM_TIMEOUT:g} s"))
                continue
            except BaseException as exc:  # SystemExit, KeyboardInterrupt: the module's, not the template's
                dropped.append((name, f"importing it raised {type(exc).__name__}: {_describe(exc)}"))
                continue
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            threads = _threads()
            if threads > 1:
                # Every module this import brought in goes too: the next
                # template must not import the culprit again through one of them.
                chain = [other for other in list(sys.modules)[count:] if other != name]
                why = f"importing it started {threads - 1} thread(s), and a process with threads must not fork"
                dropped.append((name, why + (f" (dropped with the {len(chain)} modules it imported)" if chain else "")))
                dropped.extend((other, f"{_ALONG}{name!r}, which started a thread") for other in chain)
                tried.update(chain)
                return done, dropped, True
            done.append(name)
    finally:
        signal.signal(signal.SIGALRM, alarm)
        for var in pinned:
            os.environ.pop(var, None)
    return done, dropped, False


class _TookTooLong(Exception):
    pass


def _took_too_long(*_: object) -> None:
    raise _TookTooLong


def _threads() -> int:
    """This process's threads, native ones included."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # pragma: no cover - no /proc: Python's own threads
        return threading.active_count()


def _describe(exc: BaseException) -> str:
    try:
        return str(exc)[:200]
    except BaseException:
        return "(its message could not be read)"
