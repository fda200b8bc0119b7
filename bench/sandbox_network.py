"""What a sandbox's network allow-list costs: the same download and the same
connections from a job of an untrusted lane with the network
(``Sandbox(network=True)``: straight to the server) and of one with an
allow-list (``Sandbox(network=[...])``: through procq's proxy), in the same
run, alternating rounds. Run by ``python -m bench.sandbox`` (or alone:
``python -m bench.sandbox_network [--quick]``).

download
    A job fetches 100 MiB over HTTP with ``urllib`` from a server on
    127.0.0.2 (in a process of its own, as on another machine: not sharing
    the supervisor's interpreter with the proxy), reading 1 MiB at a time;
    the job times it itself, so worker starts are not counted. The same
    server, the same job function, the two lanes' rounds interleaved.
    Through the proxy the bytes cross two loopbacks: the host's, from the
    server to the proxy (as they do straight to a job), and then the job's
    network namespace's own, which procq sets up to carry packets of up to
    512 KiB where the kernel allows (``_system.egress_bridge``); the
    host's is left as it is. Target: through the proxy at least 0.8x the
    throughput without it.

connection set-up
    A job opens fresh TCP connections to an echo server on 127.0.0.2 (in
    that same process), one after the other, and times each from
    ``connect()`` to the first byte echoed back: straight there, or
    through the proxy with SOCKS5 (the greeting and the request sent at
    once, as curl does). Target: the proxy adds at most 1 ms to the median.
"""

from __future__ import annotations

import http.server
import os
import platform
import socket
import socketserver
import statistics
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from bench import standalone
from procq import Job, Lane, ProcQueue, Sandbox
from procq._system.egress_proxy import MAX_CONNECTIONS

MIB = 1 << 20


class _Big(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    chunk = b"x" * MIB

    def do_GET(self) -> None:
        size = int(self.path.strip("/") or 1) * MIB
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.send_header("Connection", "close")
        self.end_headers()
        for _ in range(size // MIB):
            self.wfile.write(self.chunk)

    def log_message(self, *args: Any) -> None:
        pass


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True


def download(url: str) -> list[float]:
    """In the job: [seconds, bytes] of fetching ``url`` with urllib."""
    import urllib.request

    began = time.perf_counter()
    got = 0
    with urllib.request.urlopen(url, timeout=60) as answer:
        while block := answer.read(MIB):
            got += len(block)
    return [time.perf_counter() - began, float(got)]


def connections(host: str, port: int, n: int) -> list[float]:
    """In the job: ms from connect() to the first echoed byte, for ``n``
    fresh connections, straight there or (with a proxy in the environment)
    through it with SOCKS5."""
    proxy = os.environ.get("ALL_PROXY")
    request = b"\x05\x01\x00" + b"\x05\x01\x00\x01" + socket.inet_aton(host) + struct.pack("!H", port)
    times = []
    for _ in range(n):
        began = time.perf_counter()
        if proxy:
            address = proxy.split("//")[1].rsplit(":", 1)
            sock = socket.create_connection((address[0], int(address[1])), timeout=10)
            sock.sendall(request)
            got = b""
            while len(got) < 12:
                got += sock.recv(12 - len(got))
            if got[:2] != b"\x05\x00" or got[3] != 0:
                raise RuntimeError(f"the proxy refused: {got!r}")
        else:
            sock = socket.create_connection((host, port), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(b"x")
        sock.recv(1)
        times.append((time.perf_counter() - began) * 1e3)
        sock.close()
    return times


def tunnels(host: str, port: int, n: int, size: int, hold: float) -> int:
    """In the job: ``n`` connections through the proxy with SOCKS5, each
    echoing ``size`` bytes, all then held open ``hold`` seconds (while the
    bench reads the supervisor's memory). The bytes echoed, in all."""
    proxy = os.environ["ALL_PROXY"].split("//")[1].rsplit(":", 1)
    request = b"\x05\x01\x00" + b"\x05\x01\x00\x01" + socket.inet_aton(host) + struct.pack("!H", port)
    held, echoed = [], 0
    for _ in range(n):
        sock = socket.create_connection((proxy[0], int(proxy[1])), timeout=30)
        sock.sendall(request)
        got = b""
        while len(got) < 12:
            got += sock.recv(12 - len(got))
        sock.sendall(bytes(size))
        left = size
        while left:
            left -= len(sock.recv(min(left, MIB)))
        echoed += size
        held.append(sock)
    time.sleep(hold)
    for sock in held:
        sock.close()
    return echoed


def serve() -> None:
    """The servers, in a process of their own (as they would be on another
    machine: not sharing the supervisor's interpreter with the proxy): their
    ports on stdout, then serve until stdin closes."""
    web = http.server.ThreadingHTTPServer(("127.0.0.2", 0), _Big)
    echo = _EchoServer(("127.0.0.2", 0), _Echo)
    for server in (web, echo):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print(web.server_address[1], echo.server_address[1], flush=True)
    sys.stdin.read()


def run(quick: bool) -> list[str]:
    """The figures, as Markdown lines."""
    mib, rounds, conns = (20, 2, 50) if quick else (100, 5, 200)
    servers = subprocess.Popen(
        [sys.executable, "-c", "from bench.sandbox_network import serve; serve()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert servers.stdout is not None
        web_port, echo_port = (int(p) for p in servers.stdout.readline().split())
        rates, setups = _measure(web_port, echo_port, mib, rounds, conns)
        held = _held(echo_port)
    finally:
        servers.communicate(timeout=30)  # stdin closed: it exits
    d_rate, p_rate = statistics.median(rates["direct"]), statistics.median(rates["proxied"])
    d_setup, p_setup = statistics.median(setups["direct"]), statistics.median(setups["proxied"])
    ratio, added = p_rate / d_rate, p_setup - d_setup
    return [
        f"# bench.sandbox_network: Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.2f}; {rounds} rounds of a {mib} MiB download and {conns // rounds} connections",
        "",
        "| figure | network=True (direct) | network=[...] (proxied) | proxied / direct |",
        "|---|---|---|---|",
        f"| download, median MiB/s | {d_rate:.0f} | {p_rate:.0f} | {ratio:.2f}x |",
        f"| connection set-up, median ms | {d_setup:.3f} | {p_setup:.3f} | {added:+.3f} ms |",
        "",
        "| tunnels held open by one job (its lane's limit) | supervisor's RSS growth, MiB | per tunnel, KiB |",
        "|---|---|---|",
        *(f"| {what} | {grew:.1f} | {grew * 1024 / MAX_CONNECTIONS:.0f} |" for what, grew in held.items()),
        "",
        f"[{'MET' if ratio >= 0.8 else 'MISSED'}] download through the proxy at least 0.8x direct: {ratio:.2f}x",
        f"[{'MET' if added <= 1.0 else 'MISSED'}] connection set-up adds at most 1 ms: {added:+.3f} ms",
    ]


def _measure(
    web_port: int, echo_port: int, mib: int, rounds: int, conns: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    lanes = {
        "direct": Lane(workers=1, trusted=False, sandbox=Sandbox(network=True)),
        "proxied": Lane(workers=1, trusted=False, sandbox=Sandbox(network=[f"127.0.0.2:{web_port}",
                                                                            f"127.0.0.2:{echo_port}"])),
    }  # fmt: skip
    rates: dict[str, list[float]] = {k: [] for k in lanes}
    setups: dict[str, list[float]] = {k: [] for k in lanes}
    url = f"http://127.0.0.2:{web_port}/{mib}"
    with ProcQueue(lanes) as q:
        for lane in lanes:  # warm: the workers started, the proxy's first connection made
            q.push_and_wait(Job(f"warm-{lane}", download, args=(f"http://127.0.0.2:{web_port}/1",), lane=lane))
        for i in range(rounds):
            for lane in lanes:
                took, got = q.push_and_wait(Job(f"d-{lane}-{i}", download, args=(url,), lane=lane))
                rates[lane].append(got / MIB / took)
                setups[lane] += q.push_and_wait(
                    Job(f"c-{lane}-{i}", connections, args=("127.0.0.2", echo_port, conns // rounds), lane=lane)
                )
    return rates, setups


def _held(echo_port: int) -> dict[str, float]:
    """The supervisor's peak RSS growth while one job holds its lane's
    limit of tunnels open: idle (a byte echoed each) and after each carried
    8 MiB both ways. Read from this process (the supervisor: the proxy runs
    on its threads) every 20 ms while the job holds them."""
    import psutil

    me = psutil.Process()
    lane = Lane(workers=1, trusted=False, sandbox=Sandbox(network=[f"127.0.0.2:{echo_port}"]))
    grew = {}
    with ProcQueue({"proxied": lane}) as q:
        q.push_and_wait(Job("warm", tunnels, args=("127.0.0.2", echo_port, 1, 1, 0.0)))
        for what, size in (("idle (1 byte echoed each)", 1), ("busy (8 MiB echoed each)", 8 * MIB)):
            base = me.memory_info().rss
            job = Job(f"held-{size}", tunnels, args=("127.0.0.2", echo_port, MAX_CONNECTIONS, size, 2.0))
            handle = q.push(job).handle  # type: ignore[union-attr]
            peak = base
            while not handle.done():
                peak = max(peak, me.memory_info().rss)
                time.sleep(0.02)
            handle.result()
            grew[what] = (peak - base) / MIB
    return grew


def main(argv: list[str] | None = None) -> None:
    standalone.main("sandbox_network", __doc__ or "", run, argv, "a smaller download, fewer rounds")


if __name__ == "__main__":
    main()
