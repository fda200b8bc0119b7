"""A queue opened while a child process imports the program's main module:
the script has no ``if __name__ == "__main__":`` guard around it.

Under the forkserver and spawn start methods every new process runs the main
script again as it starts (as ``__mp_main__``), so a script that opens a
``ProcQueue`` at its top level opens one in every worker, which
``multiprocessing`` refuses with a long ``RuntimeError``, printed by every
worker that starts (three interleaved tracebacks before procq's own error).

``check`` is called first thing by every queue and executor. In a child
importing the main module it ends that child at once, silently, with
``EXIT_CODE``: the supervisor, seeing its workers die with that code, fails
their jobs with one message saying what to do (``_supervisor.failures``).
In procq's forkserver, which imports the main module once for all its
children (``forkserver_main``), it raises ``MainNotGuarded`` instead: the
server lives on, and each child imports the main module itself, and exits
as above.
"""

from __future__ import annotations

import os
import sys

__all__ = ["EXIT_CODE", "MainNotGuarded", "check", "flush_std", "message"]

#: A worker's exit code that says its main module opened a queue as it was imported.
EXIT_CODE = 86


class MainNotGuarded(RuntimeError):
    """The main module opened a queue while a child process imported it."""


def message(what: str = "the program's main module") -> str:
    return (
        f"{what} opens a procq queue when it is imported, and every worker imports it as it starts "
        "(the forkserver and spawn start methods run the main script again in each new process): put the "
        "code that opens the queue under if __name__ == '__main__':"
    )


def check() -> None:
    """Called by every queue and executor as it opens (see the module docstring)."""
    from multiprocessing import process

    if not getattr(process.current_process(), "_inheriting", False):
        return
    server = sys.modules.get("procq._worker.forkserver_main")
    if server is not None and getattr(server, "importing", False):
        raise MainNotGuarded(message())
    flush_std()
    os._exit(EXIT_CODE)


def flush_std() -> None:
    """Flush ``sys.stdout`` and ``sys.stderr``, whatever they are (a child
    about to exit, or to be forked from, must not leave buffered text)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass
