"""The worker: the loop a child process runs, and nothing else.

A worker receives one job at a time on its own pipe, runs it, and sends back
the result or the exception. It never decides anything about keys or states:
the supervisor does. It exits when its pipe reaches EOF (the supervisor closed
it, or died), and on Linux also when its parent dies (``PR_SET_PDEATHSIG``), so
a worker in the middle of a long job cannot outlive a SIGKILLed supervisor.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any

from procq._protocol import ERROR, OK, READY, RUN, FnMirror, dumps

__all__ = ["worker_main"]

_PR_SET_PDEATHSIG = 1


class _Unloadable:
    """Stands in the function cache for a function that failed to unpickle."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _die_with_parent() -> None:
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
    parent = _parent()
    _drop_forkserver_alive_fd()
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except Exception:  # pragma: no cover - exotic libc
            pass
    if parent is None:  # pragma: no cover - always set by multiprocessing
        return
    sentinel = parent.sentinel

    def watch() -> None:
        from multiprocessing.connection import wait

        wait([sentinel])
        os._exit(1)

    # Started after prctl: a parent that died before it took effect is seen here.
    threading.Thread(target=watch, name="procq-parent-watch", daemon=True).start()


def _drop_forkserver_alive_fd() -> None:
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


def _parent() -> Any:
    import multiprocessing

    return multiprocessing.parent_process()


def _error_fields(exc: BaseException, exc_bytes: bytes | None, note: str = "") -> tuple[Any, ...]:
    """The ERROR message's fields after the job id: pickled exception, type, message, traceback."""
    text = str(exc)
    message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if note:
        message = f"{message} {note}"
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return (exc_bytes, type(exc).__qualname__, message, tb)


def _pickle_exception(exc: BaseException) -> tuple[bytes | None, str]:
    """Pickle ``exc`` for the supervisor, or say in a note why it cannot travel."""
    try:
        data = dumps(exc)
    except Exception as err:
        return None, f"(the exception could not be pickled to send to the supervisor: {err!r})"
    try:
        pickle.loads(data)  # one that pickles but cannot load is as good as none
    except Exception as err:
        return None, f"(the exception pickles but could not be unpickled again: {err!r})"
    return data, ""


def worker_main(conn: Connection, lane: str) -> None:
    """Run jobs from ``conn`` until EOF. The child's entry point."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's to handle
    if hasattr(signal, "pthread_sigmask"):
        # The supervisor starts workers with SIGINT blocked, so that a Ctrl-C
        # landing while one boots stays pending; now that it is ignored, a
        # pending one is discarded and the mask can be the usual one.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if hasattr(os, "setsid"):
        try:
            os.setsid()  # lead a session, so a job's whole process tree can be killed
        except OSError:  # pragma: no cover - already a group leader
            pass
    _die_with_parent()

    try:
        _serve(conn)
    except (BrokenPipeError, ConnectionResetError, EOFError):
        pass  # the supervisor closed our pipe, or died: nothing is left to do
    sys.stdout.flush()
    sys.stderr.flush()


def _serve(conn: Connection) -> None:
    fns = FnMirror()
    recv, send = conn.recv_bytes, conn.send_bytes
    loads = pickle.loads
    send(dumps((0, READY)))  # until now a signal could still kill us: no job was at risk
    while True:
        try:
            frame = recv()
        except (EOFError, OSError):
            return
        tag, job_id, fn_id, fn_bytes, args_bytes = loads(frame)
        assert tag == RUN
        try:
            if fn_bytes is None:
                fn = fns.get(fn_id)
                fns.touch(fn_id)
            else:
                try:
                    fn = loads(fn_bytes)
                except BaseException as exc:
                    fn = _Unloadable(exc)
                fns.touch(fn_id, fn)
            if isinstance(fn, _Unloadable):
                raise fn.error
            args, kwargs = loads(args_bytes)
        except BaseException as exc:
            note = "(the job's function or arguments could not be unpickled in the worker)"
            send(dumps((job_id, ERROR) + _error_fields(exc, None, note)))
            continue
        try:
            result = fn(*args, **kwargs) if kwargs else fn(*args)
        except BaseException as exc:
            send(dumps((job_id, ERROR) + _error_fields(exc, *_pickle_exception(exc))))
            continue
        try:
            data = dumps(result)
        except BaseException as exc:
            note = f"(the job's result, a {type(result).__name__}, could not be pickled)"
            send(dumps((job_id, ERROR) + _error_fields(exc, None, note)))
            continue
        del result
        send(dumps((job_id, OK, data)))
