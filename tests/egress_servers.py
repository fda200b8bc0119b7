"""Servers the network allow-list tests start on loopback addresses: HTTP
(a greeting naming the server and the Host it was asked for, or ``/mib/N``:
N MiB), over IPv6 too, and a TCP echo."""

from __future__ import annotations

import http.server
import socket
import socketserver
from typing import Any


class Hello(http.server.BaseHTTPRequestHandler):
    """GET: "hello from <server address> for <Host>", or /mib/N: N MiB of zeros."""

    def do_GET(self) -> None:
        self._hello()

    def _hello(self) -> None:
        if self.path.startswith("/mib/"):  # that many MiB
            size = int(self.path[5:]) << 20
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            for _ in range(size >> 16):
                self.wfile.write(bytes(1 << 16))
            return
        body = f"hello from {self.server.server_address[0]} for {self.headers['Host']}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class KeepAlive(Hello):
    """A listed server as a hostile job would wish for: HTTP/1.1 that keeps
    every connection open, whatever the request asks (``Connection:
    close`` included), and serves what follows on it. Each request it
    reads is recorded (method, path, Host) in its server's ``seen``; a
    POST's body is read by its length and answered as a GET."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.server.seen.append((self.command, self.path, self.headers["Host"]))  # type: ignore[attr-defined]
        self._hello()
        self.close_connection = False

    def do_POST(self) -> None:
        if self.headers.get("Transfer-Encoding") == "chunked":
            while size := int(self.rfile.readline().split(b";")[0], 16):
                self.rfile.read(size + 2)
            while self.rfile.readline() not in (b"\r\n", b""):  # trailers
                pass
        else:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.do_GET()


class RecordingServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.seen: list[tuple[str, str, str]] = []


class V6Server(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6


class Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


class EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class Banner(socketserver.BaseRequestHandler):
    """A server that speaks first (as SSH and SMTP do): a banner, then an echo."""

    def handle(self) -> None:
        self.request.sendall(b"220 hello\r\n")
        while data := self.request.recv(65536):
            self.request.sendall(data)
