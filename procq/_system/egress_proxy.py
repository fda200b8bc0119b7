"""The egress proxy: the one way out of a sandbox with a network allow-list.

It runs in the supervisor's process, on threads of its own (never the I/O
thread's): one acceptor per lane, waiting on the bridges and listeners of
the lane's workers (``_system.egress_bridge``), and one thread per
connection (two while it relays). A job reaches it at ``127.0.0.1:PORT`` in
its network namespace, and speaks one of:

- HTTP, as to a forward proxy (``http://`` URLs): an absolute URI whose host
  and port are checked, and a ``Host`` header that must name the same; the
  request goes on with ``Connection: close`` (one request per connection,
  so a second one cannot name another host);
- ``CONNECT host:port``, for TLS: the tunnel's first bytes must be a TLS
  ClientHello that names (SNI) the host connected to; anything else (plain
  HTTP, a nested ``CONNECT``) is refused;
- SOCKS5 (no authentication, ``CONNECT`` only), for other TCP, by name or
  address; a ClientHello sent through it is checked as above.

The proxy decides by name and port (``_model.network.AllowList``), resolves
names itself, and connects only to addresses the list allows. It never
reads TLS payloads. Every refusal is counted for the job that made it
(``Gate``) and for the lane; the job's worker reads them when the job ends.

Limits: at most ``max_connections`` open connections per job (more are
refused, counted as ``"limit"``), at most ``max_bytes`` relayed per job
if set (past it every connection of the job is closed and new ones are
refused, counted as ``"limit"``), a handshake must arrive within
``HANDSHAKE_TIMEOUT`` and a connection idle for ``idle_timeout`` is closed.
When a job ends its connections are closed; when the lane closes, all.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import select
import selectors
import socket
import struct
import threading
import time
from collections import Counter

from procq._model.network import AllowList, Refused, host_name
from procq._system.egress_wire import (
    HEAD_LIMIT,
    Malformed,
    client_hello,
    looks_like_http,
    parse_request,
    split_authority,
)

__all__ = ["EgressProxy", "Gate"]

HANDSHAKE_TIMEOUT = 10.0
IDLE_TIMEOUT = 300.0
MAX_CONNECTIONS = 64
_CHUNK = 1 << 20
_F_SETPIPE_SZ = 1031
_SPLICE = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
_HOP_BY_HOP = {"connection", "proxy-connection", "keep-alive", "proxy-authorization", "te", "upgrade"}


class _Refusal(Exception):
    def __init__(self, what: str, target: str, why: str) -> None:
        super().__init__(f"{target} ({why})")
        self.what, self.target, self.why = what, target, why


class _Job:
    """One job's use of the proxy (under its gate's lock)."""

    __slots__ = ("conns", "key", "moved", "refused", "upstreams")

    def __init__(self, key: str) -> None:
        self.key = key
        self.moved = 0  # bytes relayed, both ways
        self.refused: Counter[tuple[str, str, str]] = Counter()
        self.conns: set[socket.socket] = set()  # from the job (their number is limited)
        self.upstreams: set[socket.socket] = set()  # to where they lead


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
        self._job: _Job | None = None
        self.closed = False

    def begin(self, key: str) -> None:
        """The worker was sent job ``key``: connections from now on are its."""
        with self._lock:
            self._job = _Job(key)

    def end(self) -> tuple[Refused, ...]:
        """The job's process has exited (and its leftovers with it): close its
        connections, drop any it left waiting, and give what it was refused."""
        with self._lock:
            job, self._job = self._job, None
            self._drain()
            conns = [*job.conns, *job.upstreams] if job is not None else []
        if job is None:
            return ()
        for conn in conns:  # their threads close them
            _shut(conn)
        return tuple(Refused(what, target, why, n) for (what, target, why), n in job.refused.items())

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

    def hold(self, job: _Job, upstream: socket.socket, held: bool = True) -> None:
        """``upstream`` is (or, ``held`` False, no longer is) open for ``job``: closed if the job ends."""
        with self._lock:
            if held:
                job.upstreams.add(upstream)
            else:
                job.upstreams.discard(upstream)

    def spend(self, job: _Job, n: int) -> bool:
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
            _shut(conn)
        return False

    def refuse(self, job: _Job, refusal: _Refusal) -> None:
        with self._lock:
            self._count(job, refusal.what, refusal.target, refusal.why)

    def _count(self, job: _Job, what: str, target: str, why: str) -> None:
        job.refused[(what, target, why)] += 1

    def _serve(self, job: _Job, conn: socket.socket) -> None:
        try:
            _Connection(self, job, conn).serve()
        finally:
            with self._lock:
                job.conns.discard(conn)
            conn.close()

    def close(self) -> None:
        """The worker is gone: close its listener and every connection."""
        with self._lock:
            self.closed = True
            job, self._job = self._job, None
            conns = [*job.conns, *job.upstreams] if job is not None else []
        for conn in conns:
            _shut(conn)
        for sock in (self.bridge, self.listener):
            if sock is not None:
                self.proxy.forget(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _Connection:
    """One connection from a job, on a thread of its own."""

    def __init__(self, gate: Gate, job: _Job, conn: socket.socket) -> None:
        self.gate, self.job, self.conn = gate, job, conn
        self.allow: AllowList = gate.proxy.allow
        self.last = time.monotonic()
        self._got = b""  # read from the job ahead of what the handshake took (see _take)

    def serve(self) -> None:
        conn = self.conn
        conn.settimeout(HANDSHAKE_TIMEOUT)
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            first = self._got = conn.recv(4096)
            if not first:
                return
            if first[0] == 5:
                self._socks()
            else:
                self._http()
        except _Refusal as refusal:
            self.gate.refuse(self.job, refusal)
        except (OSError, Malformed):
            return

    # --- deciding and connecting --------------------------------------------------------

    def _open(self, host: str, port: int) -> tuple[socket.socket, str | None]:
        """A connection to ``host:port`` if the list allows it (and the name
        the job gave, None for an address); else ``_Refusal``."""
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            address = None
        if address is not None:
            if not self.allow.address_allowed(address, port):
                raise _Refusal("not-listed", target, "an address not on the list")
            return self._connect([str(address)], port, target), None
        name = host_name(host)
        if name is None:
            raise _Refusal("malformed", target, "not a host name or an IP address")
        if not self.allow.name_allowed(name, port):
            raise _Refusal("not-listed", target, "not on the list")
        try:
            infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise OSError(f"{target} could not be resolved: {exc}") from None
        addresses: list[str] = []
        why = ""
        for info in infos:
            found = ipaddress.ip_address(info[4][0])
            refusal = self.allow.resolved_refusal(found, port)
            if refusal is None:
                addresses.append(str(found))
            else:
                why = why or refusal
        if not addresses:
            raise _Refusal("rebinding", target, why)
        return self._connect(addresses, port, target), name

    def _connect(self, addresses: list[str], port: int, target: str) -> socket.socket:
        error: OSError | None = None
        for address in addresses:
            try:
                upstream = socket.create_connection((address, port), timeout=HANDSHAKE_TIMEOUT)
            except OSError as exc:
                error = exc
                continue
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return upstream
        raise OSError(f"{target}: {error}")

    # --- HTTP: a forward proxy and CONNECT -------------------------------------------------

    def _http(self) -> None:
        head, rest = _read_head(self.conn, self._got)
        try:
            request = parse_request(head)
        except Malformed as exc:
            self._answer(400, str(exc))
            raise _Refusal("malformed", "an HTTP request", str(exc)) from None
        if request.method == "CONNECT":
            self._tunnel(request.target, rest)
            return
        target = request.target
        if not target.lower().startswith("http://"):
            why = "https:// goes through CONNECT" if target.lower().startswith("https://") else "no absolute URI"
            self._answer(400, why)
            raise _Refusal("malformed", f"{request.method} {target[:200]}", why)
        authority, _, path = target[7:].partition("/")
        try:
            host, port = split_authority(authority, 80)
        except Malformed as exc:
            self._answer(400, str(exc))
            raise _Refusal("malformed", target[:200], str(exc)) from None
        said = [v for k, v in request.headers if k.lower() == "host"]
        if len(said) > 1 or (said and _authority(said[0], 80) != _authority(authority, 80)):
            self._answer(403, "the Host header names another host")
            raise _Refusal(
                "malformed", f"{authority} (Host: {', '.join(said)[:200]})", "the Host header names another host"
            )
        upstream = self._opened(host, port, False)
        if upstream is None:
            return
        lines = [f"{request.method} /{path} {request.version}", *(
            f"{k}: {v}" for k, v in request.headers if k.lower() not in _HOP_BY_HOP
        ), "Connection: close"]  # fmt: skip
        if not said:
            lines.insert(1, f"Host: {authority}")
        upstream.sendall("\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + rest)
        self._relay(upstream, b"", None)

    def _tunnel(self, authority: str, rest: bytes) -> None:
        try:
            host, port = split_authority(authority, None)
        except Malformed as exc:
            self._answer(400, str(exc))
            raise _Refusal("malformed", f"CONNECT {authority[:200]}", str(exc)) from None
        upstream = self._opened(host, port, False)
        if upstream is None:
            return
        self.conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self._relay(upstream, rest, (host, port), tls=True)

    def _opened(self, host: str, port: int, socks: bool) -> socket.socket | None:
        """``_open``, answering the job when it is refused or cannot connect."""
        try:
            upstream, _ = self._open(host, port)
        except _Refusal as refusal:
            if socks:
                self.conn.sendall(_socks_reply(2))
            else:
                self._answer(403, f"{refusal.target} ({refusal.why})")
            raise
        except OSError as exc:
            if socks:
                self.conn.sendall(_socks_reply(5))
            else:
                self._answer(502, str(exc))
            return None
        return upstream

    def _answer(self, status: int, text: str) -> None:
        reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}[status]
        body = (f"procq: the sandbox refused: {text}\n" if status == 403 else f"procq: {text}\n").encode()
        head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        with contextlib.suppress(OSError):
            self.conn.sendall(head.encode() + b"Connection: close\r\n\r\n" + body)

    # --- SOCKS5 ----------------------------------------------------------------------------

    def _socks(self) -> None:
        conn, take = self.conn, self._take
        version, count = take(2)
        methods = take(count)
        if 0 not in methods:
            conn.sendall(b"\x05\xff")
            return
        conn.sendall(b"\x05\x00")
        version, command, _, kind = take(4)
        if kind == 1:
            host = socket.inet_ntop(socket.AF_INET, take(4))
        elif kind == 4:
            host = socket.inet_ntop(socket.AF_INET6, take(16))
        elif kind == 3:
            host = take(take(1)[0]).decode("ascii", "replace")
        else:
            conn.sendall(_socks_reply(8))
            raise _Refusal("malformed", "a SOCKS5 request", f"address type {kind}")
        (port,) = struct.unpack("!H", take(2))
        if version != 5 or command != 1:
            conn.sendall(_socks_reply(7))
            what, why = (
                ("udp", "UDP (SOCKS5 UDP ASSOCIATE)") if command == 3 else ("malformed", f"SOCKS5 command {command}")
            )
            raise _Refusal(what, f"{host}:{port}", why)
        upstream = self._opened(host, port, True)
        if upstream is None:
            return
        conn.sendall(_socks_reply(0))
        self._relay(upstream, self._got, (host, port), tls=False)

    def _take(self, n: int) -> bytes:
        """The next ``n`` bytes from the job (a client may send its whole handshake at once)."""
        while len(self._got) < n:
            more = self.conn.recv(4096)
            if not more:
                raise Malformed("the job closed the connection partway through its request")
            self._got += more
        taken, self._got = self._got[:n], self._got[n:]
        return taken

    # --- relaying ---------------------------------------------------------------------------

    def _relay(self, upstream: socket.socket, first: bytes, tunnel: tuple[str, int] | None, tls: bool = False) -> None:
        """Copy both ways until both ends are done. ``tunnel`` (host, port):
        the first bytes from the job, if TLS (required if ``tls``), must
        name that host (an address: name nothing)."""
        idle = self.gate.proxy.idle_timeout
        self.conn.settimeout(idle)
        upstream.settimeout(idle)
        try:
            self.gate.hold(self.job, upstream)
            if tunnel is not None:
                first = self._check_hello(first, tunnel, tls)
            if first:
                if not self.gate.spend(self.job, len(first)):
                    return
                upstream.sendall(first)
            back = threading.Thread(target=self._pump, args=(upstream, self.conn), name="procq-egress", daemon=True)
            back.start()
            self._pump(self.conn, upstream)
            back.join()
        finally:
            self.gate.hold(self.job, upstream, False)
            upstream.close()

    def _check_hello(self, data: bytes, tunnel: tuple[str, int], tls: bool) -> bytes:
        host, port = tunnel
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        while True:
            if data and not tls and data[:1] != b"\x16":
                return data  # SOCKS5: not TLS, nothing to check
            if data and looks_like_http(data):
                raise _Refusal("nested", target, "plain HTTP inside a CONNECT tunnel (a nested CONNECT or request)")
            try:
                complete, sni = client_hello(data)
            except Malformed as exc:
                raise _Refusal("nested", target, f"a tunnel that is not TLS: {exc}") from None
            if complete:
                break
            if len(data) > HEAD_LIMIT:
                raise _Refusal("nested", target, "a TLS ClientHello too large to read")
            more = self.conn.recv(65536)
            if not more:
                return data
            data += more
        try:
            ipaddress.ip_address(host)
            wanted = None
        except ValueError:
            wanted = host_name(host)
        named = host_name(sni) if sni is not None else None
        if named != wanted:
            said = f"names {sni!r}" if sni is not None else "names no host"
            raise _Refusal("sni", target, f"the TLS ClientHello {said}, not the host connected to")
        return data

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        """Copy ``src`` to ``dst`` until ``src`` ends (then end ``dst``'s
        writing) or both ways have been idle for the idle timeout. The bytes
        go through a pipe with ``splice``: the kernel moves them, never
        Python (a copy in and out of a buffer here halves the throughput)."""
        idle_ms = int(self.gate.proxy.idle_timeout * 1000)
        src_fd, dst_fd = src.fileno(), dst.fileno()
        r, w = os.pipe2(os.O_CLOEXEC)
        with contextlib.suppress(OSError):
            fcntl.fcntl(w, _F_SETPIPE_SZ, _CHUNK)
        readable, writable = select.poll(), select.poll()
        readable.register(src_fd, select.POLLIN)
        writable.register(dst_fd, select.POLLOUT)
        try:
            while True:
                try:
                    n = os.splice(src_fd, w, _CHUNK, flags=_SPLICE)
                except BlockingIOError:
                    if not readable.poll(idle_ms) and time.monotonic() - self.last >= idle_ms / 1000:
                        break  # idle both ways
                    continue
                if not n or not self.gate.spend(self.job, n):
                    break
                while n:
                    try:
                        n -= os.splice(r, dst_fd, n, flags=_SPLICE)
                    except BlockingIOError:
                        if not writable.poll(idle_ms):
                            raise TimeoutError("the other end reads nothing") from None
                self.last = time.monotonic()
        except OSError:
            _shut(src)
        finally:
            os.close(r)
            os.close(w)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)


def _authority(text: str, default_port: int) -> tuple[str, int]:
    host, port = split_authority(text.strip(), default_port)
    return host.lower().rstrip("."), port


def _socks_reply(code: int) -> bytes:
    return bytes([5, code, 0, 1, 0, 0, 0, 0, 0, 0])


def _read_head(sock: socket.socket, data: bytes) -> tuple[bytes, bytes]:
    """A request's head (without the blank line) and what came after it; ``data``: what was read of it."""
    while True:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            return data[:end], data[end + 4 :]
        if len(data) > HEAD_LIMIT:
            raise Malformed(f"a request head longer than {HEAD_LIMIT} bytes")
        more = sock.recv(65536)
        if not more:
            raise Malformed("the job closed the connection before its request's head ended")
        data += more


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
