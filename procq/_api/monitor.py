"""A queue seen from outside: read-only snapshots on a UNIX socket, for ``procq top``.

A queue opened with ``monitor=True`` starts a ``Monitor``: a thread of its
own with a listening socket in the user's runtime directory
(``runtime_dir``: ``$XDG_RUNTIME_DIR/procq``, else
``<tempdir>/procq-<uid>``), named ``<pid>.<n>.<name>.sock`` (``n`` counts
the monitors this process opened: two queues may share a name). Each connection
gets one snapshot (``_core.metrics.metrics``, as JSON, one line) and is closed;
the client sends nothing, and nothing a client could send is read.

Who may connect: the directory is the user's own, mode 0700 (checked, and
refused if another user owns it or it is a symbolic link); the socket is
made mode 0600 under a temporary name and renamed into place, so it is
never reachable with looser rights; and each connection's peer credentials
(``SO_PEERCRED``) must name the same user, or it is closed unanswered.

Why serving never slows the queue: the queue's threads never wait on this
one. The snapshot holds ``Core.lock`` only to copy counters (no I/O, no
serialising); the kernel reads of the workers' memory and the JSON encoding
happen after. Sends are non-blocking: a client that connects and reads
nothing (or slowly) has its answer buffered by the kernel, and whatever the
buffer does not take is sent as the socket drains, for at most
``SEND_TIMEOUT`` seconds, beside any other client; then it is dropped.

The queue's ``close()`` (or its finalizer) stops the thread and removes the
socket; a process killed outright leaves a socket nobody listens on, which
``find`` skips and removes.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import selectors
import socket
import stat
import struct
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

from procq._model.errors import ProcQueueError
from procq._system.processes import pid_alive

if TYPE_CHECKING:
    from procq._core.core import Core

__all__ = ["SEND_TIMEOUT", "Monitor", "fetch", "find", "runtime_dir", "snapshot"]

#: How long a client may take to read its snapshot before it is dropped.
SEND_TIMEOUT = 2.0
#: Clients served at once; a connection past them is closed at once.
MAX_CLIENTS = 32
#: With a store, how often a snapshot reads its counts of ended keys (a query).
STORE_COUNTS = 5.0
_SUFFIX = ".sock"
_MAX_PATH = 107  # sun_path's 108 bytes, with the terminating NUL
_numbers = itertools.count(1)


def runtime_dir() -> str:
    """Where this user's queues put their sockets: ``$XDG_RUNTIME_DIR/procq``
    (a directory only the user can open, per the XDG spec), or, where that
    is not set, ``<tempdir>/procq-<uid>``."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base):
        return os.path.join(base, "procq")
    return _fallback_dir()


def _fallback_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"procq-{os.getuid()}")


def search_dirs() -> list[str]:
    """Where ``find`` looks: ``runtime_dir()``, then the fallback, should a
    queue have started where ``XDG_RUNTIME_DIR`` was not set (a service, cron)."""
    return list(dict.fromkeys([runtime_dir(), _fallback_dir()]))


def _own_dir(path: str) -> str:
    """Make ``path`` (mode 0700) or check it: ours, a real directory, no rights for others."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise ProcQueueError(
            f"monitor: {path} is not a directory of this user (uid {os.getuid()}); "
            "refusing to serve the queue's snapshots there"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def snapshot(core: Core, name: str, read_store: bool = True) -> dict[str, Any]:
    """What a client is sent: the queue's metrics (``QueueMetrics.to_dict``) and who it is."""
    from procq._core.metrics import metrics

    data = metrics(core, name, read_store).to_dict()
    data["version"] = 1
    data["command"] = " ".join(sys.argv)[:300]
    for failure in data["failures"]:
        failure["message"] = failure["message"][:500]
    return data


class Monitor:
    """Serves snapshots of one queue on a UNIX socket (see the module docstring)."""

    def __init__(self, core: Core, name: str) -> None:
        self._core = core
        self.name = name
        directory = _own_dir(runtime_dir())
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:32]
        self.path = os.path.join(directory, f"{os.getpid()}.{next(_numbers)}.{safe}{_SUFFIX}")
        temporary = f"{self.path}.tmp"  # (the number makes it this monitor's alone)
        if len(os.fsencode(temporary)) > _MAX_PATH:
            raise ProcQueueError(
                f"monitor: the socket path {temporary!r} is longer than a UNIX socket's {_MAX_PATH} bytes; "
                "set XDG_RUNTIME_DIR (or TMPDIR) to a shorter directory"
            )
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            self._sock.bind(temporary)
            os.chmod(temporary, 0o600)
            os.rename(temporary, self.path)  # (replaces a dead process's socket of the same pid, number and name)
            self._inode = os.stat(self.path).st_ino
            self._sock.listen(MAX_CLIENTS)
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        self._wake_r, self._wake_w = os.pipe()
        self._stop = False
        self._counted = -math.inf  # when a store's counts were last read
        self.serving = 0  # clients being sent a snapshot now (written by the thread alone)
        self._thread = threading.Thread(target=self._run, name=f"procq-monitor-{name}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and remove the socket (idempotent)."""
        if self._stop:
            return
        self._stop = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"\0")
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
        if not self._thread.is_alive():  # (else leave the pipe open: never write to a reused descriptor)
            os.close(self._wake_r)
            os.close(self._wake_w)
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._inode:  # (not another queue's, made since)
                os.unlink(self.path)

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._sock, selectors.EVENT_READ)
        selector.register(self._wake_r, selectors.EVENT_READ)
        clients: dict[socket.socket, tuple[memoryview, float]] = {}  # what is left to send, and until when
        try:
            while not self._stop:
                now = time.monotonic()
                for conn, (_, until) in list(clients.items()):
                    if until <= now:
                        selector.unregister(conn)
                        del clients[conn]
                        conn.close()
                self.serving = len(clients)
                timeout = min((until for _, until in clients.values()), default=None)
                for key, _ in selector.select(None if timeout is None else max(0.0, timeout - now)):
                    if key.fileobj is self._sock:
                        self._accept(selector, clients)
                    elif key.fileobj is not self._wake_r:
                        self._send(selector, clients, key.fileobj)  # type: ignore[arg-type]
        except Exception:  # pragma: no cover - a bug here must not touch the queue
            import traceback

            traceback.print_exc()
        finally:
            for conn in clients:
                conn.close()
            selector.close()
            self._sock.close()

    def _accept(self, selector: selectors.BaseSelector, clients: dict[socket.socket, tuple[memoryview, float]]) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            conn.setblocking(False)
            if len(clients) >= MAX_CLIENTS or not _same_user(conn):
                conn.close()
                continue
            # A store's counts of ended keys are a query under its connection's lock:
            # read at most every STORE_COUNTS seconds, however many clients ask.
            now = time.monotonic()
            read_store = now - self._counted >= STORE_COUNTS
            if read_store:
                self._counted = now
            try:
                payload = json.dumps(snapshot(self._core, self.name, read_store)).encode() + b"\n"
            except Exception:  # pragma: no cover - a bug: this client goes unanswered, the next may not
                conn.close()
                import traceback

                traceback.print_exc()
                continue
            clients[conn] = (memoryview(payload), time.monotonic() + SEND_TIMEOUT)
            selector.register(conn, selectors.EVENT_WRITE)
            self._send(selector, clients, conn)

    def _send(
        self, selector: selectors.BaseSelector, clients: dict[socket.socket, tuple[memoryview, float]],
        conn: socket.socket,
    ) -> None:  # fmt: skip
        left, until = clients[conn]
        try:
            sent = conn.send(left)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the client went away
            sent = len(left)
        if sent < len(left):
            clients[conn] = (left[sent:], until)
            return
        selector.unregister(conn)
        del clients[conn]
        conn.close()


def _same_user(conn: socket.socket) -> bool:
    """Is the peer this process's user? (The socket's mode says so already; this is the second lock.)"""
    if not hasattr(socket, "SO_PEERCRED"):  # pragma: no cover - not Linux: the 0600 socket and 0700 directory
        return True
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return bool(uid == os.getuid())


# --- the client side (``procq top``) --------------------------------------------------


def find(pid: int | None = None) -> list[str]:
    """The sockets of this user's monitored queues (of process ``pid``, if
    given), oldest process first, in ``search_dirs()`` (each used only if it
    is this user's own directory). A socket whose process is gone is removed."""
    found: list[tuple[int, str]] = []
    for directory in search_dirs():
        try:
            info = os.lstat(directory)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            found += _sockets(directory, pid)
    return [path for _, path in sorted(found)]


def _sockets(directory: str, pid: int | None) -> list[tuple[int, str]]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found: list[tuple[int, str]] = []
    for entry in names:
        head = entry.split(".", 1)[0]
        if not entry.endswith(_SUFFIX) or not head.isdigit():
            continue
        owner = int(head)
        path = os.path.join(directory, entry)
        if not pid_alive(owner):
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        if pid is None or owner == pid:
            found.append((owner, path))
    return found


def fetch(path: str, timeout: float = 5.0) -> dict[str, Any]:
    """One snapshot from a queue's socket. Raises ``OSError`` if it cannot be
    reached, ``ValueError`` if what it sent is not a snapshot."""
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        chunks = []
        while True:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    data = json.loads(b"".join(chunks))
    if not isinstance(data, dict) or "stats" not in data:
        raise ValueError(f"{path} did not send a procq snapshot")
    return data
