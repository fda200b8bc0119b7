"""Jobs for test_sandbox_network: what a job with a network allow-list tries
to reach, through the proxy its environment names and around it. Each
attempt is reported (JSON), never assumed."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import ssl
import struct
import subprocess
import urllib.error
import urllib.request
from typing import Any


def _proxy() -> tuple[str, int]:
    url = os.environ["HTTP_PROXY"]  # http://127.0.0.1:PORT
    host, port = url.split("//")[1].split(":")
    return host, int(port)


def fetch(url: str, cafile: str | None = None) -> list[Any]:
    """urllib, as any program would use it: ["ok", body] or ["refused", status or error]."""
    context = ssl.create_default_context(cafile=cafile) if cafile else None
    try:
        with urllib.request.urlopen(url, timeout=20, context=context) as answer:
            return ["ok", answer.read().decode()]
    except urllib.error.HTTPError as exc:
        return ["refused", exc.code]
    except (urllib.error.URLError, OSError) as exc:
        return ["refused", repr(exc)]


def curl(*args: str) -> list[Any]:
    """A curl subprocess: [exit status, stdout]."""
    done = subprocess.run(["curl", "-sS", "--max-time", "20", *args], capture_output=True, text=True, timeout=60)
    return [done.returncode, done.stdout]


def client_hello(name: str | None) -> bytes:
    """The bytes of a real TLS ClientHello naming ``name`` (none: no SNI), from Python's ssl."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=name)
    with contextlib.suppress(ssl.SSLWantReadError):  # it waits for the server's answer: the hello is out
        tls.do_handshake()
    return outgoing.read()


def _echoed(sock: socket.socket, sent: bytes) -> str:
    """What came back of ``sent`` from an echo server: "echoed", or why not."""
    sock.settimeout(20)
    got = b""
    try:
        while len(got) < len(sent):
            more = sock.recv(65536)
            if not more:
                return f"closed after {len(got)} bytes"
            got += more
    except OSError as exc:
        return f"refused: {exc!r}"
    return "echoed" if got == sent else "garbled"


def tunnel(target: str, sni: str | None, payload: str = "hello") -> list[str]:
    """CONNECT ``target`` through the proxy, then send a ClientHello naming
    ``sni`` (``payload="http"``: a plain HTTP request instead, as a nested
    CONNECT would): [the proxy's status line, what the echo server gave back]."""
    with socket.create_connection(_proxy(), timeout=20) as sock:
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            more = sock.recv(4096)
            if not more:
                return ["closed", ""]
            head += more
        status = head.split(b"\r\n")[0].decode()
        if " 200 " not in status:
            return [status, ""]
        data = client_hello(sni) if payload == "hello" else b"CONNECT evil.test:443 HTTP/1.1\r\n\r\n"
        sock.sendall(data)
        return [status, _echoed(sock, data)]


def socks(host: str, port: int, command: int = 1, payload: bytes = b"ping") -> list[Any]:
    """SOCKS5 to ``host`` (a name, or an address: sent as one): [reply code, what came back]."""
    with socket.create_connection(_proxy(), timeout=20) as sock:
        sock.sendall(b"\x05\x01\x00")
        if sock.recv(2) != b"\x05\x00":
            return [-1, "no method"]
        try:
            address = socket.inet_pton(socket.AF_INET, host)
            kind = b"\x01"
        except OSError:
            try:
                address = socket.inet_pton(socket.AF_INET6, host)
                kind = b"\x04"
            except OSError:
                address = bytes([len(host)]) + host.encode()
                kind = b"\x03"
        sock.sendall(b"\x05" + bytes([command]) + b"\x00" + kind + address + struct.pack("!H", port))
        reply = sock.recv(10)
        if len(reply) < 2:
            return [-1, "closed"]
        if reply[1] != 0:
            return [reply[1], ""]
        if not payload:
            return [0, "connected"]
        sock.sendall(payload)
        return [0, _echoed(sock, payload)]


def around(host: str, port: int) -> dict[str, str]:
    """What a program that ignores the proxy gets: TCP straight to the
    server, UDP to it, and a name looked up (no resolver in the sandbox)."""
    said: dict[str, str] = {}
    try:
        socket.create_connection((host, port), timeout=5).close()
        said["tcp"] = "reached"
    except OSError as exc:
        said["tcp"] = f"refused: {exc!r}"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.sendto(b"leak", (host, port))
        said["udp"] = "sent"
    except OSError as exc:
        said["udp"] = f"refused: {exc!r}"
    try:
        said["dns"] = f"reached: {socket.getaddrinfo('example.com', 443)[0][4]}"
    except OSError as exc:
        said["dns"] = f"refused: {exc!r}"
    return said


def flood(target: str, n: int) -> dict[str, int]:
    """Hold ``n`` CONNECT tunnels to ``target`` open at once: how many the proxy took, how many it refused."""
    held, said = [], {"taken": 0, "refused": 0}
    try:
        for _ in range(n):
            sock = socket.create_connection(_proxy(), timeout=20)
            held.append(sock)
            sock.sendall(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
        for sock in held:
            try:
                head = sock.recv(4096)
            except OSError:
                head = b""
            said["taken" if b" 200 " in head else "refused"] += 1
    finally:
        for sock in held:
            sock.close()
    return said


def fail_after_fetch(url: str) -> None:
    """Fetch ``url`` (refused, say), then fail as a tool would that could not reach it."""
    raise RuntimeError(f"could not fetch: {fetch(url)}")


def banner(host: str, port: int) -> str:
    """SOCKS5 to a server that speaks first: its banner, read before the job sends a byte."""
    with socket.create_connection(_proxy(), timeout=20) as sock:
        sock.sendall(b"\x05\x01\x00\x05\x01\x00\x01" + socket.inet_aton(host) + struct.pack("!H", port))
        got = b""
        while not got.endswith(b"\r\n"):
            more = sock.recv(4096)
            if not more:
                return f"closed after {got!r}"
            got += more
        return got[12:].decode()


def raw_http(head: str) -> str:
    """A request head sent to the proxy as it is: the status line it answers."""
    with socket.create_connection(_proxy(), timeout=20) as sock:
        sock.sendall(head.encode("latin-1"))
        answer = sock.recv(4096)
        return answer.split(b"\r\n")[0].decode()


def fetch_with(library: str, url: str, cafile: str | None = None) -> list[Any]:
    """``requests`` or ``httpx``, as a program would use them: ["ok", body] or ["refused", status or error]."""
    if library == "requests":
        import requests

        try:
            answer = requests.get(url, timeout=20, verify=cafile or True)
        except requests.RequestException as exc:
            return ["refused", repr(exc)[:300]]
        return ["ok", answer.text] if answer.ok else ["refused", answer.status_code]
    import httpx

    try:
        answer = httpx.get(url, timeout=20, verify=cafile or True)
    except httpx.HTTPError as exc:
        return ["refused", repr(exc)[:300]]
    return ["ok", answer.text] if answer.is_success else ["refused", answer.status_code]


def fetch_then_hang(url: str) -> None:
    """Fetch ``url`` (refused, say), then run until the job's timeout kills it."""
    import threading

    fetch(url)
    threading.Event().wait()


def loopback_packet() -> int | None:
    """The largest IPv4 packet the job's loopback carries (rtnetlink's
    IFLA_GSO_IPV4_MAX_SIZE), or None where the kernel does not say."""
    request = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, socket.if_nametoindex("lo"), 0, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as rtnl:
        rtnl.settimeout(10)
        rtnl.send(struct.pack("=IHHII", 16 + len(request), 18, 1, 1, 0) + request)  # RTM_GETLINK, NLM_F_REQUEST
        answer = rtnl.recv(65536)
    offset = 16 + len(request)  # past the message's header and its struct ifinfomsg: the attributes
    while offset + 4 <= len(answer):
        size, kind = struct.unpack_from("=HH", answer, offset)
        if size < 4:
            break
        if kind == 63:  # IFLA_GSO_IPV4_MAX_SIZE
            return int(struct.unpack_from("=I", answer, offset + 4)[0])
        offset += (size + 3) & ~3
    return None


def refusals(n: int, port: int) -> list[str]:
    """Ask the proxy ``n`` times for a host off the list, each time another
    (127.0.0.3 at ``n`` ports from ``port`` on): the status lines it answered, counted."""
    answers: dict[str, int] = {}
    for i in range(n):
        with socket.create_connection(_proxy(), timeout=20) as sock:
            sock.sendall(f"CONNECT 127.0.0.3:{port + i} HTTP/1.1\r\n\r\n".encode())
            status = sock.recv(4096).split(b"\r\n")[0].decode()
        answers[status] = answers.get(status, 0) + 1
    return [f"{status} x{count}" for status, count in answers.items()]


def trickle(head: str, interval: float, seconds: float) -> str:
    """Send ``head`` to the proxy a byte every ``interval`` seconds, for at
    most ``seconds``: how it ended (the proxy closed it after so many bytes,
    or it answered, or it was still open)."""
    import time

    data = head.encode("latin-1")
    with socket.create_connection(_proxy(), timeout=20) as sock:
        deadline = time.monotonic() + seconds
        for i in range(len(data)):
            if time.monotonic() > deadline:
                return f"still open after {i} bytes"
            try:
                sock.sendall(data[i : i + 1])
            except OSError:
                return f"closed after {i} bytes"
            ready, _, _ = select.select([sock], [], [], interval)
            if ready:
                try:
                    got = sock.recv(4096)
                except OSError:  # closed with bytes of ours unread: a reset
                    got = b""
                if not got:
                    return f"closed after {i + 1} bytes"
                if got.startswith(b"HTTP/"):
                    return f"answered {got.split(b' ')[1].decode()}"
                # (SOCKS5's answer to its greeting: the handshake goes on)
        return "sent it all"


def connect_then_wait(target: str, seconds: float) -> str:
    """CONNECT to ``target``, then send nothing: how long the proxy kept the tunnel open for no ClientHello."""
    import time

    start = time.monotonic()
    with socket.create_connection(_proxy(), timeout=seconds) as sock:
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
        answer = sock.recv(4096)
        if b" 200 " not in answer.split(b"\r\n")[0] + b" ":
            return f"answered {answer[:40]!r}"
        try:
            got = sock.recv(4096)
        except TimeoutError:
            return "still open"
        return f"closed after {time.monotonic() - start:.1f} s" if not got else f"sent {got[:40]!r}"


def heavy_heads(url: str, kib: int, times: int) -> list[str]:
    """Ask ``url`` through the proxy ``times`` times, each request's head
    carrying ``kib`` KiB of header: the status of each, or how it failed."""
    said = []
    request = urllib.request.Request(url, headers={"X-Filler": "h" * (kib << 10)})
    for _ in range(times):
        try:
            with urllib.request.urlopen(request, timeout=20) as answer:
                answer.read()
                said.append(str(answer.status))
        except urllib.error.HTTPError as exc:
            said.append(str(exc.code))
        except OSError as exc:
            said.append(type(exc).__name__)
    return said


def connect_only(target: str) -> str:
    """Send a CONNECT for ``target`` and read what comes back, to its end."""
    with socket.create_connection(_proxy(), timeout=20) as sock:
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
        got = b""
        while more := sock.recv(4096):
            got += more
        return got.split(b"\r\n")[0].decode() or "closed"


def exchange(data: str, then: str = "") -> list[str]:
    """``data`` sent to the proxy at once; with ``then``, that too once a
    whole first answer has come back (as a client that keeps a connection
    alive would). The status lines of every answer read until the proxy
    closes the connection."""
    got = b""
    with socket.create_connection(_proxy(), timeout=20) as sock:
        sock.sendall(data.encode("latin-1"))
        if then:
            while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < _length(got):
                more = sock.recv(65536)
                if not more:
                    break
                got += more
            with contextlib.suppress(OSError):
                sock.sendall(then.encode("latin-1"))
        return _statuses(sock, got)


def _statuses(sock: socket.socket, got: bytes) -> list[str]:
    """The status lines of every answer in ``got`` and what ``sock`` brings until it closes."""
    with contextlib.suppress(OSError):
        while more := sock.recv(65536):
            got += more
    return [line.decode() for line in got.split(b"\r\n") if line.startswith(b"HTTP/1.")]


def _length(answer: bytes) -> int:
    for line in answer.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def socks_http(host: str, port: int, *parts: str) -> list[str]:
    """SOCKS5 to ``host:port`` (an address), then ``parts`` sent one by one,
    a moment apart (each its own TCP segment, as a job splitting its
    request would send it): the status lines of what came back before the
    proxy closed the connection."""
    import time

    with socket.create_connection(_proxy(), timeout=20) as sock:
        sock.sendall(b"\x05\x01\x00")
        sock.recv(2)
        sock.sendall(b"\x05\x01\x00\x01" + socket.inet_aton(host) + struct.pack("!H", port))
        if sock.recv(10)[1:2] != b"\x00":
            return ["refused by SOCKS5"]
        for i, part in enumerate(parts):
            if i:
                time.sleep(0.2)
            with contextlib.suppress(OSError):
                sock.sendall(part.encode("latin-1"))
        return _statuses(sock, b"")


def hold_tunnels(host: str, port: int, n: int, hold: float) -> int:
    """``n`` connections through the proxy with SOCKS5 to ``host:port`` (an
    echo server, by address), a byte echoed on each, all then held open
    ``hold`` seconds: how many echoed."""
    import time

    held: list[socket.socket] = []
    try:
        for _ in range(n):
            sock = socket.create_connection(_proxy(), timeout=20)
            held.append(sock)
            sock.sendall(b"\x05\x01\x00\x05\x01\x00\x01" + socket.inet_aton(host) + struct.pack("!H", port))
            got = b""
            while len(got) < 12:
                got += sock.recv(12 - len(got))
            sock.sendall(b"x")
            if sock.recv(1) != b"x":
                break
        time.sleep(hold)
        return len(held)
    finally:
        for sock in held:
            sock.close()
