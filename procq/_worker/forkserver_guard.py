"""Imported only by the ``multiprocessing`` forkserver that procq starts (it
is first on the list of modules the server preloads; nothing else imports
it), to close that server to the jobs of untrusted lanes:

- The server is made not dumpable, and so is every trusted worker it forks,
  from its first instruction: no process of the same user without
  ``CAP_SYS_PTRACE`` can trace it, read its memory or environment, or take
  its descriptors, and so none can subvert the trusted workers it forks
  later. (A trusted worker makes itself dumpable again when no queue of its
  supervisor has an untrusted lane: see ``_worker.worker_main``.)
- The server forks only for its own parent. Its listening socket is a file
  any process of the same user may connect to, and the server would fork, for
  whoever does, a child that runs whatever that client sends, with the
  server's memory and environment (the supervisor's, as they were when the
  server started). Each connection's peer is checked (``SO_PEERCRED``, set by
  the kernel at ``connect``) before the server takes a request from it.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from typing import Any

from procq._system.privileges import set_dumpable

__all__: list[str] = []


def _guard() -> None:
    set_dumpable(False)
    try:
        from multiprocessing import reduction
    except Exception:  # pragma: no cover
        return
    server_pid, parent = os.getpid(), os.getppid()
    receive = reduction.recvfds

    def recvfds(sock: Any, size: int) -> Any:
        # The forkserver's loop calls this on each accepted connection; its
        # children (trusted workers) inherit the wrapper and pass through.
        if os.getpid() == server_pid:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid = struct.unpack("3i", creds)[0]
            if pid != parent:
                # The server's loop drops the connection on this errno and goes on.
                raise ConnectionAbortedError(errno.ECONNABORTED, f"forkserver: refused a request from process {pid}")
        return receive(sock, size)

    reduction.recvfds = recvfds


_guard()
