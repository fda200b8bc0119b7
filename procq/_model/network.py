"""A sandbox's network allow-list (``Sandbox(network=[...])``): its entries,
checked when made, and the decisions the egress proxy takes with them.

An entry is a host name (``"pypi.org"``), a wildcard for the subdomains of
one (``"*.example.com"``, not ``example.com`` itself), an IP address or a
CIDR range (``"127.0.0.1"``, ``"10.0.0.0/8"``, ``"::1"``, ``"[fd00::/8]"``),
each with an optional port (``"api.example.com:443"``, ``"[::1]:8080"``);
without one it allows ports 80 and 443.

A destination given by name is reached only if the name is listed, and only
at addresses that are public, or listed themselves: a listed name that
resolves to a loopback, private or link-local address (DNS rebinding) is
refused unless that address is on the list too. A destination given as an
address is reached only if an address entry covers it: listing a name never
allows its addresses typed out.
"""

from __future__ import annotations

import ipaddress
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "DEFAULT_PORTS",
    "AllowList",
    "Entry",
    "Refusals",
    "Refused",
    "check_network",
    "check_network_bytes",
    "describe",
    "parse_entry",
]

#: The ports an entry without one allows.
DEFAULT_PORTS: tuple[int, ...] = (80, 443)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)\Z")


@dataclass(frozen=True)
class Entry:
    """One allow-list entry: a name (``"*.x.org"`` for subdomains) or an address range, and its ports."""

    name: str | None
    network: IPNetwork | None
    ports: tuple[int, ...]

    def __str__(self) -> str:
        if self.name is not None:
            host = self.name
        else:
            assert self.network is not None
            net = self.network
            host = str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net)
            if net.version == 6 and self.ports != DEFAULT_PORTS:
                host = f"[{host}]"
        return host if self.ports == DEFAULT_PORTS else f"{host}:{self.ports[0]}"


def host_name(text: str) -> str | None:
    """``text`` as a host name (lower case, no trailing dot), or None if it
    is not one. A name whose last label is all digits is not a name (it would
    resolve as an address: ``2130706433`` is 127.0.0.1)."""
    name = text.lower().rstrip(".") if text.endswith(".") and not text.endswith("..") else text.lower()
    if not name or len(name) > 253:
        return None
    labels = name.split(".")
    if not all(_LABEL.match(label) for label in labels) or labels[-1].isdigit():
        return None
    return name


def _port(entry: str, text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        raise ValueError(f"Sandbox network entry {entry!r}: the port {text!r} is not a number from 1 to 65535")
    return int(text)


def parse_entry(entry: Any) -> Entry:
    """One entry of ``Sandbox(network=[...])``; ``ValueError`` naming what is wrong with it."""
    if not isinstance(entry, str):
        raise TypeError(f"Sandbox network entries must be str, got {type(entry).__name__}: {entry!r}")
    text = entry.strip()
    if "://" in text:
        raise ValueError(f"Sandbox network entry {entry!r}: give a host (and a port), not a URL")
    host, ports = text, DEFAULT_PORTS
    if text.startswith("["):  # [IPv6] or [IPv6]:port
        close = text.find("]")
        if close < 0:
            raise ValueError(f"Sandbox network entry {entry!r}: an IPv6 address opened with '[' is never closed")
        host, rest = text[1:close], text[close + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"Sandbox network entry {entry!r}: only ':PORT' may follow ']'")
            ports = (_port(entry, rest[1:]),)
        return Entry(None, _network(entry, host, v6=True), ports)
    if text.count(":") == 1:
        host, port = text.split(":")
        ports = (_port(entry, port),)
    elif text.count(":") > 1:  # a bare IPv6 address or range: no port
        return Entry(None, _network(entry, text, v6=True), ports)
    if not host:
        raise ValueError(f"Sandbox network entry {entry!r}: no host before the port")
    if host == "*":
        raise ValueError(f"Sandbox network entry {entry!r}: '*' allows every host: say network=True")
    if _looks_numeric(host):
        return Entry(None, _network(entry, host, v6=False), ports)
    wildcard = host.startswith("*.")
    name = host_name(host[2:] if wildcard else host)
    if name is None or "*" in host[2 if wildcard else 0 :]:
        raise ValueError(
            f"Sandbox network entry {entry!r}: {host!r} is not a host name, an IP address or a CIDR range "
            "(a wildcard is '*.' before a name: '*.example.com')"
        )
    return Entry(f"*.{name}" if wildcard else name, None, ports)


def _looks_numeric(host: str) -> bool:
    return all(part.isdigit() for part in host.split("/")[0].split("."))


def _network(entry: str, host: str, v6: bool) -> IPNetwork:
    try:
        net = ipaddress.ip_network(host, strict=True)
    except ValueError as exc:
        what = "an IPv6 address or range" if v6 else "an IP address or CIDR range"
        raise ValueError(f"Sandbox network entry {entry!r}: {host!r} is not {what}: {exc}") from None
    if v6 and net.version != 6:
        raise ValueError(f"Sandbox network entry {entry!r}: '[...]' is for IPv6 addresses; write {host!r} bare")
    return net


def check_network(value: Any) -> bool | tuple[str, ...]:
    """``Sandbox(network=...)`` checked: a bool, or the allow-list as a tuple
    of its entries written one way (so that a Sandbox hashes and compares)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(
            f"Sandbox network must be False, True or a list of allowed hosts, got {type(value).__name__}: {value!r}"
        )
    entries: list[str] = []
    for item in value:
        text = str(parse_entry(item))
        if text not in entries:
            entries.append(text)
    if not entries:
        raise ValueError("Sandbox network=[] allows no host: say network=False for no network")
    return tuple(entries)


def check_network_bytes(value: Any, network: Any) -> None:
    """``Sandbox(network_bytes=...)`` checked: a positive int, with an allow-list (the proxy counts them)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Sandbox network_bytes must be an int or None, got {type(value).__name__}: {value!r}")
    if value < 1:
        raise ValueError(f"Sandbox network_bytes must be at least 1, got {value}")
    if not isinstance(network, tuple):
        raise ValueError(
            "Sandbox network_bytes needs an allow-list (network=[...]): only procq's proxy counts a job's bytes"
        )


def unlisted_kind(address: IPAddress) -> str | None:
    """What kind of address a name must not resolve to unless it is listed: loopback, private, ...; None if public."""
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for kind in ("loopback", "link_local", "private", "multicast", "unspecified", "reserved"):
        if getattr(address, f"is_{kind}"):
            return kind.replace("_", "-")
    return None if address.is_global else "non-global"


class AllowList:
    """The decisions the egress proxy takes for one sandbox's list."""

    def __init__(self, entries: Iterable[str]) -> None:
        self.entries = tuple(parse_entry(e) for e in entries)

    def name_allowed(self, name: str, port: int) -> bool:
        """Is ``name`` (a host name, lower case) at ``port`` listed?"""
        for entry in self.entries:
            if entry.name is None or port not in entry.ports:
                continue
            if entry.name.startswith("*."):
                if name.endswith(entry.name[1:]) and len(name) > len(entry.name) - 1:
                    return True
            elif name == entry.name:
                return True
        return False

    def address_allowed(self, address: IPAddress, port: int) -> bool:
        """Is ``address`` at ``port`` covered by an address entry? (An
        IPv4-mapped IPv6 address counts as the IPv4 address it maps.)"""
        if address.version == 6 and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(
            e.network is not None and port in e.ports and address.version == e.network.version and address in e.network
            for e in self.entries
        )

    def resolved_refusal(self, address: IPAddress, port: int) -> str | None:
        """Why a listed name may not be reached at ``address`` (None: it may)."""
        kind = unlisted_kind(address)
        if kind is None or self.address_allowed(address, port):
            return None
        return f"resolves to {kind} {address}, not on the list"


# --- what was refused ---------------------------------------------------------------------------


class Refused(NamedTuple):
    """What a sandbox's allow-list refused a job, and how many times.

    ``what`` is the kind (the ``what`` label of ``procq_sandbox_refused_total``):

    - ``"not-listed"``: a host, address or port not on the list;
    - ``"rebinding"``: a listed name that resolved to a loopback, private or
      link-local address not on the list;
    - ``"sni"``: a TLS ClientHello that named another host than the one connected to;
    - ``"nested"``: a ``CONNECT`` tunnel that did not start with TLS (plain
      HTTP, a nested ``CONNECT``);
    - ``"udp"``: UDP asked of the proxy (SOCKS5 ``UDP ASSOCIATE``);
    - ``"malformed"``: a request the proxy could not read, or that names a
      destination in a form it does not take (a ``Host`` header naming
      another host than the URL, a number for a name);
    - ``"limit"``: a connection past the job's limit, or bytes past its
      ``network_bytes`` (its connections are then closed).
    """

    what: str
    target: str  # "evil.example.com:443", or what the job asked where it named no destination
    why: str  # in words
    times: int

    def __str__(self) -> str:
        return f"{self.target} ({self.why})" + (f" x{self.times}" if self.times > 1 else "")


def describe(refused: Iterable[Refused]) -> str:
    """One line for a log or a failure message: "the sandbox refused: a:443 (not on the list) x3; ..."."""
    return "the sandbox refused: " + "; ".join(str(r) for r in refused)


class Refusals:
    """A lane's record of what its allow-list refused: counts by kind (for
    its metrics), and each job's refusals by key (for its handle), the last
    ``keep`` jobs that had any. Written by the thread that reads a job's end,
    read by any thread; its own lock guards it."""

    def __init__(self, keep: int = 10_000, max_records: int = 20_000) -> None:
        self._lock = threading.Lock()
        self._keep = keep
        # In all, across jobs: a job's own are bounded where they are made
        # (the proxy's gate), so this bounds the memory a lane's hold.
        self._max_records = max_records
        self._records = 0
        self._by_kind: Counter[str] = Counter()
        self._by_key: OrderedDict[str, tuple[Refused, ...]] = OrderedDict()

    def record(self, key: str, refused: tuple[Refused, ...]) -> None:
        """Job ``key`` ended having been refused ``refused`` (maybe nothing);
        the oldest jobs' records go past ``keep`` jobs or ``max_records`` records."""
        with self._lock:
            self._records -= len(self._by_key.pop(key, ()))
            if not refused:
                return
            for r in refused:
                self._by_kind[r.what] += r.times
            self._by_key[key] = refused
            self._records += len(refused)
            while len(self._by_key) > self._keep or self._records > self._max_records:
                self._records -= len(self._by_key.popitem(last=False)[1])

    def of(self, key: str) -> tuple[Refused, ...] | None:
        """The refusals of the last job of ``key`` that ended here, if it had any."""
        with self._lock:
            return self._by_key.get(key)

    def by_kind(self) -> dict[str, int]:
        with self._lock:
            return dict(self._by_kind)
