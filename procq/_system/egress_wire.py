"""What the egress proxy reads from a job: an HTTP proxy request (its head
and its body's framing, by h11, the strict sans-I/O HTTP/1.1 parser), and
a TLS ClientHello's server name (SNI). Parsing only, on bytes: no socket,
no decision (``_system.egress_proxy`` decides). Each parser refuses what
it cannot read with ``Malformed``.
"""

from __future__ import annotations

import re
import struct
from typing import NamedTuple

import h11

__all__ = [
    "Answer",
    "Forward",
    "Malformed",
    "Request",
    "client_hello",
    "looks_like_http",
    "read_request",
    "split_authority",
]

#: The most a request's head may take: more is refused.
HEAD_LIMIT = 64 * 1024

_BYTES = re.compile(r"bytearray\(b(['\"])(.*)\1\)")  # how h11 quotes what it refused
_BARE = re.compile(rb"\r(?!\n)|(?<!\r)\n")
_METHODS = (b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"TRACE", b"CONNECT")


class Malformed(ValueError):
    """What the job sent is not what its protocol allows."""


class Request(NamedTuple):
    """An HTTP proxy request's head, as h11 read it."""

    method: str
    target: str  # "host:port" for CONNECT, else the absolute URI
    version: str
    headers: list[tuple[str, str]]  # names as the job wrote them


class Forward:
    """One request on its way to its destination: read from the job by h11
    (a server's parser), written again by h11 (a client's writer). The
    destination sees one request, framed one way (``Content-Length`` or
    chunked, as h11 read the job's), whatever the job sent; the body's
    trailers are dropped. What the job sends after the request's end is
    not read as a request: it is ``beyond``."""

    def __init__(self, parser: h11.Connection) -> None:
        self._parser = parser
        self._writer = h11.Connection(h11.CLIENT)
        self.done = False
        self.beyond = b""

    def head(self, method: str, target: str, headers: list[tuple[str, str]]) -> bytes:
        """The request's head as the destination reads it (always HTTP/1.1)."""
        try:
            return self._writer.send(h11.Request(method=method, target=target, headers=headers)) or b""
        except h11.LocalProtocolError as exc:
            raise Malformed(f"a request that cannot be sent on: {exc}") from None

    def body(self, data: bytes) -> bytes:
        """More of the job's bytes (``b""``: none, only what is buffered):
        the body's bytes among them, framed for the destination. Sets
        ``done`` at the body's end, ``beyond`` to what followed it."""
        if data:
            self._parser.receive_data(data)
        out: list[bytes] = []
        while not self.done:
            try:
                event = self._parser.next_event()
                if event is h11.NEED_DATA:
                    break
                if isinstance(event, h11.Data):
                    out.append(self._writer.send(h11.Data(data=bytes(event.data))) or b"")
                elif isinstance(event, h11.EndOfMessage):
                    out.append(self._writer.send(h11.EndOfMessage()) or b"")
                    self.done = True
                    self.beyond = bytes(self._parser.trailing_data[0])
            except (h11.RemoteProtocolError, h11.LocalProtocolError) as exc:
                raise Malformed(f"a request body that is not framed as its head says: {exc}") from None
        return b"".join(out)


class Answer:
    """Where the destination's answer to a forwarded request ends, so that
    the connection ends with it (one request per connection, even with a
    destination that keeps connections open). Its head, informational
    answers (``100 Continue``) before it included, is read by h11; a sized
    body is then counted, not parsed (the proxy's downloads run at the
    sockets' speed); a chunked one is followed by h11; one without either
    ends when the destination closes. An answer h11 cannot read is
    relayed as it comes, until the destination closes: it is not the job
    that wrote it."""

    def __init__(self, method: str) -> None:
        self._parser = h11.Connection(h11.CLIENT)
        self._parser.send(h11.Request(method=method, target="/", headers=[("Host", "-")]))
        self._parser.send(h11.EndOfMessage())
        self._head = b""
        self._mode = "head"  # then "sized", "chunked" or "close"
        self._left = 0  # a sized body's bytes still to come
        self.done = False

    def take(self, data: memoryview) -> int:
        """How many of ``data``'s first bytes belong to the answer; ``done`` once it has ended."""
        taken = 0
        while taken < len(data) and not self.done:
            rest = data[taken:]
            if self._mode == "sized":
                n = min(len(rest), self._left)
                self._left -= n
                taken += n
                self.done = self._left == 0
            elif self._mode == "head":
                taken += self._read_head(rest)
            else:
                if self._mode == "chunked":
                    self._follow(bytes(rest))
                taken = len(data)
        return taken

    def _read_head(self, data: memoryview) -> int:
        before = len(self._head)
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > HEAD_LIMIT:
                self._mode = "close"
            return len(data)
        head, self._head = self._head[: end + 4], b""
        try:
            self._parser.receive_data(head)
            event = self._parser.next_event()
            if isinstance(event, h11.Response):
                after = self._parser.next_event()
                if isinstance(after, h11.EndOfMessage):
                    self.done = True
                else:
                    fields = {name: value for name, value in event.headers}
                    if b"chunked" in fields.get(b"transfer-encoding", b""):
                        self._mode = "chunked"
                    elif b"content-length" in fields:
                        self._mode, self._left = "sized", int(fields[b"content-length"])
                    else:
                        self._mode = "close"
        except (h11.RemoteProtocolError, ValueError):
            self._mode = "close"
        return end + 4 - before

    def _follow(self, data: bytes) -> None:
        try:
            self._parser.receive_data(data)
            while (event := self._parser.next_event()) is not h11.NEED_DATA:
                if isinstance(event, h11.EndOfMessage):
                    self.done = True
                    return
        except h11.RemoteProtocolError:
            self._mode = "close"


def read_request(head: bytes, rest: bytes) -> tuple[Request, Forward]:
    """A request head (up to and without the blank line; at most
    ``HEAD_LIMIT``) and what came after it: the request, and its way on.
    h11 refuses what HTTP/1.1 does not allow (names and values with bytes
    no header may hold, a request line of another shape, two ``Host``
    headers, a transfer coding other than chunked); here also a bare CR or
    LF (another reader could split the head elsewhere) and a
    ``Content-Length`` beside ``Transfer-Encoding`` (a request two readers
    could end at two places). A request without ``Host`` is read as
    naming the host of its absolute URI (or of its ``CONNECT``), as a
    proxy must (RFC 9112, 3.2.2), where h11 alone would refuse it."""
    if _BARE.search(head):
        raise Malformed("a request head with a bare CR or LF")
    head = _with_host(head)
    parser = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_LIMIT + 4)
    parser.receive_data(head + b"\r\n\r\n" + rest)
    try:
        event = parser.next_event()
    except h11.RemoteProtocolError as exc:
        raise Malformed(_BYTES.sub(r"\1\2\1", str(exc))[:200]) from None
    if not isinstance(event, h11.Request):  # pragma: no cover - a whole head always makes a Request
        raise Malformed("not an HTTP request")
    headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in event.headers.raw_items()]
    names = {name.lower() for name, _ in headers}
    if "content-length" in names and "transfer-encoding" in names:
        raise Malformed("both Content-Length and Transfer-Encoding")
    method, target, version = (x.decode("latin-1") for x in (event.method, event.target, event.http_version))
    return Request(method.upper(), target, f"HTTP/{version}", headers), Forward(parser)


def _with_host(head: bytes) -> bytes:
    line, _, fields = head.partition(b"\r\n")
    if any(field[:5].lower() == b"host:" for field in fields.split(b"\r\n")):
        return head
    parts = line.split(b" ")
    if len(parts) != 3:
        return head  # h11 says what is wrong with it
    scheme, sep, rest = parts[1].partition(b"://")
    authority = rest.partition(b"/")[0] if sep else (scheme if parts[0].upper() == b"CONNECT" else b"")
    return head if not authority else line + b"\r\nHost: " + authority + (b"\r\n" + fields if fields else b"")


def split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) as host and port; the host without brackets."""
    if "@" in authority:
        raise Malformed(f"user information in the authority {authority[:200]!r}")
    host, port_text = authority, ""
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            raise Malformed(f"an IPv6 address never closed in {authority[:200]!r}")
        host, rest = authority[1:close], authority[close + 1 :]
        if rest and not rest.startswith(":"):
            raise Malformed(f"{authority[:200]!r} is not [address]:port")
        port_text = rest[1:]
    elif authority.count(":") == 1:
        host, port_text = authority.split(":")
    elif ":" in authority:
        raise Malformed(f"an IPv6 address without brackets in {authority[:200]!r}")
    if not port_text:
        if default_port is None:
            raise Malformed(f"no port in {authority[:200]!r}")
        return host, default_port
    # ASCII digits only: str.isdigit() is true of "²" too, which int() refuses.
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
        raise Malformed(f"the port {port_text[:20]!r} in {authority[:200]!r}")
    return host, int(port_text)


def could_be_http(data: bytes) -> bool:
    """Could these first bytes (some, or all, of a method's) start an HTTP request?"""
    return any((m + b" ").startswith(data[: len(m) + 1]) for m in _METHODS)


def looks_like_http(data: bytes) -> bool:
    """Do these first bytes start an HTTP request (a nested CONNECT among them)?"""
    return any(data.startswith(m + b" ") for m in _METHODS)


def client_hello(data: bytes) -> tuple[bool, str | None]:
    """The first bytes of a TLS connection, as far as they came: (complete,
    server name). ``complete`` False: more bytes are needed. The server name
    is None when the ClientHello names none. Raises ``Malformed`` for
    anything that is not a ClientHello."""
    if len(data) < 5:
        if data and data[0] != 0x16:
            raise Malformed("not a TLS handshake")
        return False, None
    kind, _major, length = data[0], data[1], struct.unpack("!H", data[3:5])[0]
    if kind != 0x16 or _major != 3:
        raise Malformed("not a TLS handshake")
    if len(data) < 5 + length:
        return False, None
    body = data[5 : 5 + length]
    try:
        return True, _server_name(body)
    except (IndexError, struct.error):
        raise Malformed("a TLS ClientHello cut short or malformed") from None


def _server_name(body: bytes) -> str | None:
    if body[0] != 0x01:
        raise Malformed("a TLS handshake that does not start with a ClientHello")
    end = 4 + int.from_bytes(body[1:4], "big")
    if end > len(body):
        raise Malformed("a ClientHello split over several TLS records")
    i = 4 + 2 + 32  # version, random
    i += 1 + body[i]  # session id
    i += 2 + struct.unpack("!H", body[i : i + 2])[0]  # cipher suites
    i += 1 + body[i]  # compression methods
    if i >= end:
        return None  # no extensions
    ext_end = i + 2 + struct.unpack("!H", body[i : i + 2])[0]
    i += 2
    names: list[str] = []
    while i + 4 <= ext_end:
        kind, size = struct.unpack("!HH", body[i : i + 4])
        i += 4
        if kind == 0:  # server_name
            j, list_end = i + 2, i + 2 + struct.unpack("!H", body[i : i + 2])[0]
            while j + 3 <= list_end:
                name_type, name_len = body[j], struct.unpack("!H", body[j + 1 : j + 3])[0]
                if name_type == 0:
                    names.append(body[j + 3 : j + 3 + name_len].decode("ascii", "replace"))
                j += 3 + name_len
        i += size
    if len(names) > 1:
        raise Malformed("a ClientHello naming more than one server")
    return names[0] if names else None
