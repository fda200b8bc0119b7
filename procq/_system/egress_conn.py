"""One connection from a sandboxed job to the egress proxy, on a thread of
its own: the handshake it speaks (HTTP forward proxy, ``CONNECT``, SOCKS5;
see ``_system.egress_proxy`` for what each is allowed), the decision on its
destination (``_model.network.AllowList``), the connection out, the TLS
ClientHello check of a tunnel, and the relay both ways.
Whatever it refuses it raises as ``Refusal``, which its gate counts. A job's
use of the proxy (its connections, bytes and refusals) is a ``Job``; what a
connection needs of its gate and proxy is said here as protocols
(``Gate``, ``Proxy``), which ``_system.egress_proxy`` fulfils.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import NoReturn, Protocol

from procq._model.network import AllowList, host_name
from procq._system.egress_relay import Relay, shut
from procq._system.egress_wire import (
    HEAD_LIMIT,
    Answer,
    Forward,
    Malformed,
    Request,
    client_hello,
    could_be_http,
    looks_like_http,
    read_request,
    split_authority,
)

__all__ = ["HANDSHAKE_TIMEOUT", "Connection", "Gate", "Job", "Refusal"]

HANDSHAKE_TIMEOUT = 10.0
_HOP_BY_HOP = {"connection", "proxy-connection", "keep-alive", "proxy-authorization", "te", "upgrade"}


class Refusal(Exception):
    """What the proxy refused a job: its kind (``Refused.what``), the destination, why."""

    def __init__(self, what: str, target: str, why: str) -> None:
        super().__init__(f"{target} ({why})")
        self.what, self.target, self.why = what, target, why
        self.counted = False


class Job:
    """One job's use of the proxy (under its gate's lock)."""

    __slots__ = ("conns", "key", "moved", "refused", "upstreams")

    def __init__(self, key: str) -> None:
        self.key = key
        self.moved = 0  # bytes relayed, both ways
        self.refused: Counter[tuple[str, str, str]] = Counter()
        self.conns: set[socket.socket] = set()  # from the job (their number is limited)
        self.upstreams: set[socket.socket] = set()  # to where they lead


class Proxy(Protocol):
    """What a connection reads of the proxy (``_system.egress_proxy.EgressProxy``)."""

    @property
    def allow(self) -> AllowList: ...

    @property
    def idle_timeout(self) -> float: ...


class Gate(Protocol):
    """What a connection needs of its worker's gate (``_system.egress_proxy.Gate``)."""

    @property
    def proxy(self) -> Proxy: ...

    def hold(self, job: Job, upstream: socket.socket, held: bool = True) -> None: ...

    def spend(self, job: Job, n: int) -> bool: ...

    def refuse(self, job: Job, refusal: Refusal) -> None: ...


class Connection:
    """One connection from a job, on a thread of its own."""

    def __init__(self, gate: Gate, job: Job, conn: socket.socket) -> None:
        self.gate, self.job, self.conn = gate, job, conn
        self.allow: AllowList = gate.proxy.allow
        # The whole handshake (a request's head, SOCKS5's exchange, a
        # tunnel's TLS ClientHello) is read by then, however slowly it comes.
        self.deadline = time.monotonic() + HANDSHAKE_TIMEOUT
        self._got = b""  # read from the job ahead of what the handshake took (see _take)

    def serve(self) -> None:
        conn = self.conn
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            first = self._got = self._recv(4096)
            if not first:
                return
            if first[0] == 5:
                self._socks()
            else:
                self._http()
        except Refusal as refusal:
            if not refusal.counted:
                self.gate.refuse(self.job, refusal)
        except (OSError, Malformed):
            return

    def _recv(self, n: int) -> bytes:
        """Up to ``n`` bytes of the handshake from the job, by its deadline;
        past it, a refusal (what a job that sends a byte at a time is told)."""
        left = self.deadline - time.monotonic()
        if left > 0:
            self.conn.settimeout(left)
            try:
                return self._spent(self.conn.recv(n))
            except TimeoutError:
                pass
        raise self._counted(Refusal("malformed", "a handshake", f"not finished within {HANDSHAKE_TIMEOUT:g} s"))

    def _spent(self, data: bytes) -> bytes:
        """``data``, read from the job or said to it, counted towards its
        ``network_bytes`` as it passes (heads and handshakes too, not only
        what is relayed); past the limit the job's connections end."""
        if data and not self.gate.spend(self.job, len(data)):
            raise ConnectionAbortedError("the job moved its network_bytes")
        return data

    def _say(self, data: bytes) -> None:
        """Send the proxy's own words to the job (counted as any byte)."""
        self.conn.sendall(self._spent(data))

    # --- deciding and connecting --------------------------------------------------------

    def _open(self, host: str, port: int) -> socket.socket:
        """A connection to ``host:port`` if the list allows it; else ``Refusal``."""
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            address = None
        if address is not None:
            if not self.allow.address_allowed(address, port):
                raise Refusal("not-listed", target, "an address not on the list")
            return self._connect([str(address)], port, target)
        name = host_name(host)
        if name is None:
            raise Refusal("malformed", target, "not a host name or an IP address")
        if not self.allow.name_allowed(name, port):
            raise Refusal("not-listed", target, "not on the list")
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
            raise Refusal("rebinding", target, why)
        return self._connect(addresses, port, target)

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
        request, forward, rest = self._read_request(self._got)
        if request.method == "CONNECT":
            self._tunnel(request.target, rest)
            return
        target = request.target
        if not target.lower().startswith("http://"):
            why = "https:// goes through CONNECT" if target.lower().startswith("https://") else "no absolute URI"
            self._refused(400, f"{request.method} {target[:200]}", why)
        authority, _, path = target[7:].partition("/")
        try:
            host, port = split_authority(authority, 80)
        except Malformed as exc:
            self._refused(400, target[:200], str(exc))
        head = self._head_on(request, forward, authority, f"/{path}")
        upstream = self._opened(host, port, False)
        if upstream is None:
            return
        answer = Answer(request.method)
        self._relay(upstream, lambda relay: self._send_request(relay, answer, head, forward, target))

    def _read_request(self, data: bytes) -> tuple[Request, Forward, bytes]:
        """The job's request (its head by the handshake's deadline, ``data``
        what was read of it), its way on, and what followed its head; what
        cannot be read is answered 400 and refused."""
        try:
            head, rest = _read_head(self._recv, data)
        except HeadTooLong as exc:
            self._refused(400, "an HTTP request", str(exc))
        try:
            request, forward = read_request(head, rest)
        except Malformed as exc:
            self._refused(400, "an HTTP request", str(exc))
        return request, forward, rest

    def _head_on(self, request: Request, forward: Forward, authority: str, path: str) -> bytes:
        """The request's head as its destination ``authority`` (``host[:port]``)
        reads it: a ``Host`` header must name that authority (or is added),
        hop-by-hop headers are dropped, and ``Connection: close`` is said."""
        said = [v for k, v in request.headers if k.lower() == "host"]
        if len(said) > 1 or (said and _authority(said[0], 80) != _authority(authority, 80)):
            target = f"{authority} (Host: {', '.join(said)[:200]})"
            self._refused(403, target, "the Host header names another host")
        headers = [(k, v) for k, v in request.headers if k.lower() not in _HOP_BY_HOP]
        if not said:
            headers.insert(0, ("Host", authority))
        try:
            return forward.head(request.method, path, [*headers, ("Connection", "close")])
        except Malformed as exc:
            self._refused(400, f"{authority}{path}"[:200], str(exc))

    def _send_request(self, relay: Relay, answer: Answer, head: bytes, forward: Forward, target: str) -> None:
        """Send the request on: its head, then its body as it comes; the way
        back ends with ``answer``. One request per connection: whatever the
        job sends after the body's end is never read as a request (its
        ``Host`` could name any host the destination serves, and a
        destination may keep the connection open whatever it is asked): it
        is refused (``malformed``) and the connection ends both ways at once."""
        relay.answer = answer
        self.conn.settimeout(relay.idle)
        relay.upstream.sendall(head)
        data = b""
        while True:
            try:
                out = forward.body(data)
            except Malformed as exc:  # (the connection ends with it: no answer could be read as the body's)
                raise self._counted(Refusal("malformed", target[:200], str(exc))) from None
            if out:
                relay.upstream.sendall(out)
            if forward.done:
                break
            data = relay.read_job()
            if not data:  # the job went (or its network_bytes did) partway through its body
                shut(relay.upstream)
                return
        if forward.beyond or relay.read_job():
            why = "a second request on one connection: one request per connection"
            self.gate.refuse(self.job, Refusal("malformed", target[:200], why))
            shut(relay.upstream)
            shut(self.conn)

    def _refused(self, status: int, target: str, why: str) -> NoReturn:
        """Refuse a request as ``malformed``, answering ``status``."""
        refusal = self._counted(Refusal("malformed", target, why))
        self._answer(status, why)
        raise refusal

    def _counted(self, refusal: Refusal) -> Refusal:
        """Count ``refusal`` for the job now, before the job is told (by an
        answer, or by the end of its connection): a job that has read that
        may end at once, and its report must hold the refusal."""
        self.gate.refuse(self.job, refusal)
        refusal.counted = True
        return refusal

    def _tunnel(self, authority: str, rest: bytes) -> None:
        try:
            host, port = split_authority(authority, None)
        except Malformed as exc:
            self._refused(400, f"CONNECT {authority[:200]}", str(exc))
        upstream = self._opened(host, port, False)
        if upstream is None:
            return
        with _closed_on_error(upstream):
            self._say(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self._relay(upstream, lambda relay: self._carry(relay, rest, (host, port), tls=True))

    def _opened(self, host: str, port: int, socks: bool) -> socket.socket | None:
        """``_open``, answering the job when it is refused or cannot connect."""
        try:
            upstream = self._open(host, port)
        except Refusal as refusal:
            self._counted(refusal)
            if socks:
                self._say(_socks_reply(2))
            else:
                self._answer(403, f"{refusal.target} ({refusal.why})")
            raise
        except OSError as exc:
            if socks:
                self._say(_socks_reply(5))
            else:
                self._answer(502, str(exc))
            return None
        return upstream

    def _answer(self, status: int, text: str) -> None:
        reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}[status]
        body = (f"procq: the sandbox refused: {text}\n" if status == 403 else f"procq: {text}\n").encode()
        head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        with contextlib.suppress(OSError):
            self._say(head.encode() + b"Connection: close\r\n\r\n" + body)
            # Our end of the stream follows the answer at once, so the job
            # reads both before the close, which resets the connection if the
            # job sent more than was read (a head past the limit).
            self.conn.shutdown(socket.SHUT_WR)

    # --- SOCKS5 ----------------------------------------------------------------------------

    def _socks(self) -> None:
        take = self._take
        version, count = take(2)
        methods = take(count)
        if 0 not in methods:
            self._say(b"\x05\xff")
            return
        self._say(b"\x05\x00")
        version, command, _, kind = take(4)
        if kind == 1:
            host = socket.inet_ntop(socket.AF_INET, take(4))
        elif kind == 4:
            host = socket.inet_ntop(socket.AF_INET6, take(16))
        elif kind == 3:
            host = take(take(1)[0]).decode("ascii", "replace")
        else:
            refusal = self._counted(Refusal("malformed", "a SOCKS5 request", f"address type {kind}"))
            self._say(_socks_reply(8))
            raise refusal
        (port,) = struct.unpack("!H", take(2))
        if version != 5 or command != 1:
            what, why = (
                ("udp", "UDP (SOCKS5 UDP ASSOCIATE)") if command == 3 else ("malformed", f"SOCKS5 command {command}")
            )
            refusal = self._counted(Refusal(what, f"{host}:{port}", why))
            self._say(_socks_reply(7))
            raise refusal
        upstream = self._opened(host, port, True)
        if upstream is None:
            return
        with _closed_on_error(upstream):
            self._say(_socks_reply(0))
        self._relay(upstream, lambda relay: self._carry(relay, self._got, (host, port), tls=False))

    def _take(self, n: int) -> bytes:
        """The next ``n`` bytes from the job (a client may send its whole handshake at once)."""
        while len(self._got) < n:
            more = self._recv(4096)
            if not more:
                raise Malformed("the job closed the connection partway through its request")
            self._got += more
        taken, self._got = self._got[:n], self._got[n:]
        return taken

    # --- relaying ---------------------------------------------------------------------------

    def _relay(self, upstream: socket.socket, send: Callable[[Relay], None]) -> None:
        """Relay both ways (``_system.egress_relay``), ``send`` carrying the
        job's side; ``upstream`` is closed when the job ends, and after."""
        relay = Relay(self.conn, upstream, self.gate.proxy.idle_timeout, lambda n: self.gate.spend(self.job, n))
        self.gate.hold(self.job, upstream)
        try:
            relay.run(lambda: send(relay))
        finally:
            self.gate.hold(self.job, upstream, False)
            upstream.close()

    def _carry(self, relay: Relay, first: bytes, tunnel: tuple[str, int], tls: bool) -> None:
        """The job's side of a tunnel: its first bytes, if TLS (required if
        ``tls``), must name the host of ``tunnel`` (an address: name
        nothing); plain HTTP through SOCKS5 is held to the forward proxy's
        rules; anything else goes on as it comes."""
        first = self._check_hello(first, tunnel, tls)
        if not tls and could_be_http(first):
            self.deadline = time.monotonic() + HANDSHAKE_TIMEOUT  # its head, read as a handshake
            while not looks_like_http(first) and could_be_http(first) and (more := self._recv(65536)):
                first += more
            if looks_like_http(first):
                self._origin(relay, first, tunnel)
                return
        self.conn.settimeout(relay.idle)
        if first:  # (counted as it was read)
            relay.upstream.sendall(first)
        relay.pump(self.conn, relay.upstream)

    def _origin(self, relay: Relay, data: bytes, tunnel: tuple[str, int]) -> None:
        """Plain HTTP through SOCKS5, to the server itself: its ``Host`` (and
        its URL, if absolute) must name the host and port connected to, and
        it is one request per connection, as through the forward proxy (a
        listed server's other virtual hosts are not reached by naming them
        in a request to it)."""
        host, port = tunnel
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        request, forward, _ = self._read_request(data)
        path = request.target
        if path.lower().startswith("http://"):
            given, _, rest = path[7:].partition("/")
            try:
                same = _authority(given, 80) == _authority(authority, 80)
            except Malformed:
                same = False
            if not same:
                self._refused(403, f"{authority} (URL: {path[:200]})", "the URL names another host")
            path = f"/{rest}"
        elif not path.startswith("/"):
            self._refused(400, f"{request.method} {path[:200]}", "a request target that is no path or http:// URL")
        head = self._head_on(request, forward, authority, path)
        self._send_request(relay, Answer(request.method), head, forward, f"{authority}{path}")

    def _check_hello(self, data: bytes, tunnel: tuple[str, int], tls: bool) -> bytes:
        host, port = tunnel
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        while True:
            if data and not tls and data[:1] != b"\x16":
                return data  # SOCKS5: not TLS, nothing to check
            if data and looks_like_http(data):
                why = "plain HTTP inside a CONNECT tunnel (a nested CONNECT or request)"
                raise self._counted(Refusal("nested", target, why))
            try:
                complete, sni = client_hello(data)
            except Malformed as exc:
                raise self._counted(Refusal("nested", target, f"a tunnel that is not TLS: {exc}")) from None
            if complete:
                break
            if len(data) > HEAD_LIMIT:
                raise self._counted(Refusal("nested", target, "a TLS ClientHello too large to read"))
            # A tunnel's ClientHello is part of the handshake; SOCKS5 may carry
            # a protocol whose server speaks first, the client answering later.
            more = self._recv(65536) if tls else self._spent(self.conn.recv(65536))
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
            raise self._counted(Refusal("sni", target, f"the TLS ClientHello {said}, not the host connected to"))
        return data


def _authority(text: str, default_port: int) -> tuple[str, int]:
    host, port = split_authority(text.strip(), default_port)
    return host.lower().rstrip("."), port


@contextlib.contextmanager
def _closed_on_error(upstream: socket.socket) -> Iterator[None]:
    """Close ``upstream`` if what comes before ``_relay`` (which closes it
    from then on) fails: never left for the garbage collector."""
    try:
        yield
    except BaseException:
        upstream.close()
        raise


def _socks_reply(code: int) -> bytes:
    return bytes([5, code, 0, 1, 0, 0, 0, 0, 0, 0])


class HeadTooLong(Malformed):
    """A request head past ``HEAD_LIMIT``: answered 400 and refused, not just dropped."""


def _read_head(recv: Callable[[int], bytes], data: bytes) -> tuple[bytes, bytes]:
    """A request's head (without the blank line) and what came after it;
    ``data``: what was read of it; ``recv``: reads more."""
    while True:
        end = data.find(b"\r\n\r\n", 0, HEAD_LIMIT + 4)
        if end >= 0:
            return data[:end], data[end + 4 :]
        if len(data) >= HEAD_LIMIT + 4:
            raise HeadTooLong(f"a request head longer than {HEAD_LIMIT} bytes")
        more = recv(65536)
        if not more:
            raise Malformed("the job closed the connection before its request's head ended")
        data += more
