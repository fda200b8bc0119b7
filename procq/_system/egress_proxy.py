"""The egress proxy: the one way out of a sandbox with a network allow-list.

It runs in the supervisor's process, on threads of its own (never the I/O
thread's): one acceptor per lane, waiting on the bridges and listeners of
the lane's workers (``_system.egress_bridge``), and one thread per
connection (two while it relays; ``_system.egress_conn``). A job reaches it at ``127.0.0.1:PORT`` in
its network namespace, and speaks one of:

- HTTP, as to a forward proxy (``http://`` URLs): an absolute URI whose host
  and port are checked, and a ``Host`` header that must name the same; the
  request (read by h11, its body framed one way) goes on with
  ``Connection: close``, and the connection ends with its answer: one
  request per connection, so a second one cannot name another host;
- ``CONNECT host:port``, for TLS: the tunnel's first bytes must be a TLS
  ClientHello that names (SNI) the host connected to; anything else (plain
  HTTP, a nested ``CONNECT``) is refused;
- SOCKS5 (no authentication, ``CONNECT`` only), for other TCP, by name or
  address; a ClientHello sent through it is checked as above, and plain
  HTTP through it as a forward proxy's request is (its ``Host`` naming the
  host connected to, one request per connection).

The proxy decides by name and port (``_model.network.AllowList``), resolves
names itself, and connects only to addresses the list allows. It never
reads TLS payloads. Every refusal is counted for the job that made it
(``Gate``) and for the lane; the job's worker reads them when the job ends.

Limits: at most ``max_connections`` open connections per job (more are
refused, counted as ``"limit"``), at most ``max_bytes`` relayed per job
if set (past it every connection of the job is closed and new ones are
refused, counted as ``"limit"``), the whole handshake (the ClientHello of
a tunnel included) must arrive within ``HANDSHAKE_TIMEOUT`` of the
connection, a deadline rather than a limit per read, and a connection idle
for ``idle_timeout`` is closed. What a job is refused is bounded
(``MAX_RECORDS`` kinds told one by one, the rest counted by kind).
When a job ends its connections are closed; when the lane closes, all.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading

from procq._model.network import AllowList, Refused
from procq._system.egress_conn import Connection, Job, Refusal
from procq._system.egress_relay import shut

__all__ = ["IDLE_TIMEOUT", "MAX_CONNECTIONS", "MAX_RECORDS", "EgressProxy", "Gate", "Job"]

IDLE_TIMEOUT = 300.0
MAX_CONNECTIONS = 64
#: A job's refusals kept one by one (each kind: what, target and why); the
#: rest are counted by kind alone. Each record's words are cut at RECORD_CHARS.
MAX_RECORDS = 32
RECORD_CHARS = 200


class Gate:
    """One sandboxed worker's way out: its listener (once handed over), the
    job it runs, and that job's connections and refusals.

    ``begin`` and ``end`` are called by whoever sends the worker a job and
    reads its end; the acceptor thread and connection threads touch the
    running job under ``_lock`` only."""

    def __init__(self, proxy: EgressProxy, bridge: socket.socket) -> None:
        self.proxy = proxy
        self.bridge: socket.socket | None = bridge
        self.listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._job: Job | None = None
        self.closed = False

    def begin(self, key: str) -> None:
        """The worker was sent job ``key``: connections from now on are its."""
        with self._lock:
            self._job = Job(key)

    def end(self) -> tuple[Refused, ...]:
        """The job's process has exited (and its leftovers with it): close its
        connections, drop any it left waiting, and give what it was refused."""
        with self._lock:
            job, self._job = self._job, None
            self._drain()
        return _ended(job)

    def _drain(self) -> None:
        listener = self.listener
        while listener is not None:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.close()

    def accept(self) -> None:
        """On the acceptor thread: take a connection and serve it, or refuse it."""
        assert self.listener is not None
        with self._lock:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            job = self._job
            if job is None or self.closed:
                conn.close()  # between jobs: nobody may connect
                return
            limit = self.proxy.max_bytes
            if limit is not None and job.moved >= limit:
                self._count(job, "limit", "a connection", f"the job moved its network_bytes of {limit} already")
                conn.close()
                return
            if len(job.conns) >= self.proxy.max_connections:
                self._count(job, "limit", "a connection", f"more than {self.proxy.max_connections} at once")
                conn.close()
                return
            job.conns.add(conn)
        thread = threading.Thread(target=self._serve, args=(job, conn), name="procq-egress", daemon=True)
        thread.start()

    def hold(self, job: Job, upstream: socket.socket, held: bool = True) -> None:
        """``upstream`` is (or, ``held`` False, no longer is) open for ``job``: closed if the job ends."""
        with self._lock:
            if held:
                job.upstreams.add(upstream)
            else:
                job.upstreams.discard(upstream)

    def spend(self, job: Job, n: int) -> bool:
        """``job`` moved ``n`` more bytes: False (and every connection of it
        ended) once that takes it past ``max_bytes``."""
        limit = self.proxy.max_bytes
        with self._lock:
            job.moved += n
            if limit is None or job.moved <= limit:
                return True
            if job.moved - n <= limit:  # this took it past: once
                self._count(job, "limit", "the network", f"more than its network_bytes of {limit} bytes")
            conns = [*job.conns, *job.upstreams]
        for conn in conns:
            shut(conn)
        return False

    def refuse(self, job: Job, refusal: Refusal) -> None:
        with self._lock:
            self._count(job, refusal.what, refusal.target, refusal.why)

    def _count(self, job: Job, what: str, target: str, why: str) -> None:
        """One more refusal of ``job``. What a job is told, and what its lane
        keeps of it, is bounded whatever it tries: ``MAX_RECORDS`` kinds one
        by one (their words cut at ``RECORD_CHARS``), the rest counted by
        ``what`` alone."""
        key = (what, target[:RECORD_CHARS], why[:RECORD_CHARS])
        refused = job.refused
        if key not in refused and len(refused) >= MAX_RECORDS:
            key = (what, "(others)", f"not told one by one: a job's report keeps {MAX_RECORDS} kinds")
        refused[key] += 1

    def _serve(self, job: Job, conn: socket.socket) -> None:
        try:
            Connection(self, job, conn).serve()
        finally:
            with self._lock:
                job.conns.discard(conn)
            conn.close()

    def close(self) -> tuple[str, tuple[Refused, ...]] | None:
        """The worker is gone: close its listener and every connection. The
        key and refusals of the job it still held (killed: a timeout, a
        memory limit, a cancel), if any."""
        with self._lock:
            self.closed = True
            job, self._job = self._job, None
        for sock in (self.bridge, self.listener):
            if sock is not None:
                self.proxy.forget(sock)
        return None if job is None else (job.key, _ended(job))


def _ended(job: Job | None) -> tuple[Refused, ...]:
    """An ended job's connections closed (their threads close the sockets), and what it was refused."""
    if job is None:
        return ()
    for conn in [*job.conns, *job.upstreams]:  # (sets that only shrink now: nobody adds to an ended job)
        shut(conn)
    return tuple(Refused(what, target, why, n) for (what, target, why), n in job.refused.items())


class EgressProxy:
    """A sandboxed lane's egress proxy: its acceptor thread and its gates (one per worker)."""

    def __init__(
        self,
        lane: str,
        allow: AllowList,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout: float = IDLE_TIMEOUT,
        max_bytes: int | None = None,
    ) -> None:
        self.lane = lane
        self.allow = allow
        self.max_connections = max_connections
        self.max_bytes = max_bytes  # per job, both ways (Sandbox.network_bytes)
        self.idle_timeout = idle_timeout
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)  # a wake-up never blocks whoever sends it (the I/O thread among them)
        self._pending: list[tuple[str, socket.socket, Gate]] = []  # registrations for the acceptor
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"procq-egress-{lane}", daemon=True)
        self._thread.start()

    def gate(self, bridge: socket.socket) -> Gate:
        """A gate for a worker about to start, whose listener will come over ``bridge``."""
        gate = Gate(self, bridge)
        self._submit("add", bridge, gate)
        return gate

    def forget(self, sock: socket.socket) -> None:
        self._submit("drop", sock, None)  # type: ignore[arg-type]

    def _submit(self, op: str, sock: socket.socket, gate: Gate) -> None:
        with self._lock:
            if self._closed:
                sock.close()
                return
            self._pending.append((op, sock, gate))
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _run(self) -> None:
        sel = self._selector
        sel.register(self._wake_r, selectors.EVENT_READ, None)
        while True:
            for key, _ in sel.select():
                if key.data is None:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                    continue
                role, gate = key.data
                if role == "bridge":
                    self._take_listener(key.fileobj, gate)  # type: ignore[arg-type]
                else:
                    gate.accept()
            with self._lock:
                pending, self._pending = self._pending, []
                closed = self._closed
            for op, sock, gate in pending:
                if op == "add":
                    sel.register(sock, selectors.EVENT_READ, ("bridge", gate))
                else:
                    with contextlib.suppress(KeyError, ValueError):
                        sel.unregister(sock)
                    sock.close()
            if closed:
                for key in list(sel.get_map().values()):
                    if key.data is not None:
                        key.fileobj.close()  # type: ignore[union-attr]
                sel.close()
                return

    def _take_listener(self, bridge: socket.socket, gate: Gate) -> None:
        self._selector.unregister(bridge)
        try:
            _, fds, _, _ = socket.recv_fds(bridge, 16, 1)
        except OSError:
            fds = []
        bridge.close()
        gate.bridge = None
        if not fds:
            return  # the worker died before it handed its listener over
        listener = socket.socket(fileno=fds[0])
        listener.setblocking(False)
        gate.listener = listener
        if gate.closed:
            listener.close()
            return
        self._selector.register(listener, selectors.EVENT_READ, ("listener", gate))

    def close(self) -> None:
        """Stop: no more connections; the acceptor thread ends and closes every listener."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(5)
        self._wake_r.close()
        self._wake_w.close()
