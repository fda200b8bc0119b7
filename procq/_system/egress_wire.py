"""What the egress proxy reads from a job: an HTTP proxy request's head,
SOCKS5's greeting and request, and a TLS ClientHello's server name (SNI).
Parsing only, on bytes: no socket, no decision (``_system.egress_proxy``
decides). Each parser refuses what it cannot read with ``Malformed``.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

__all__ = ["Malformed", "Request", "client_hello", "looks_like_http", "parse_request", "split_authority"]

#: The most a request's head may take: more is refused.
HEAD_LIMIT = 64 * 1024

_METHODS = (b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"TRACE", b"CONNECT")


class Malformed(ValueError):
    """What the job sent is not what its protocol allows."""


class Request(NamedTuple):
    """An HTTP proxy request's head."""

    method: str
    target: str  # "host:port" for CONNECT, else the absolute URI
    version: str
    headers: list[tuple[str, str]]


def parse_request(head: bytes) -> Request:
    """A request head (up to and without the blank line)."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise Malformed("a request head that is not text") from None
    lines = text.split("\r\n")
    if any("\r" in line or "\n" in line for line in lines):  # a bare CR or LF: read one way here, another upstream
        raise Malformed("a request head with a bare CR or LF")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Malformed(f"a request line that is not 'METHOD TARGET HTTP/1.x': {lines[0][:200]!r}")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise Malformed(f"a header line that is not 'Name: value': {line[:200]!r}")
        headers.append((name, value.strip()))
    return Request(parts[0].upper(), parts[1], parts[2], headers)


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
