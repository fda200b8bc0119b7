"""The sandbox's side of an allow-listed network (``Sandbox(network=[...])``).

A sandboxed worker with an allow-list gets a network namespace of its own,
as one without network does: no interface but loopback, and no route out.
Once there, before it drops its privileges, it brings loopback up, listens on
``127.0.0.1:PORT`` and hands that listening socket to the supervisor over
the bridge (a UNIX socket pair the supervisor made; the descriptor crosses
with ``SCM_RIGHTS``), then closes its own copies. The supervisor's egress
proxy (``_system.egress_proxy``) accepts on it: a socket belongs to the
namespace it was made in, whoever holds it, so the jobs' connections to
``127.0.0.1:PORT`` arrive in the supervisor, and nothing else in the
namespace leads anywhere. No process of the sandbox relays a byte.

Why not a UNIX socket path or an abstract name: the job's view holds no
host path, and abstract names are per network namespace.
"""

from __future__ import annotations

import fcntl
import socket
import struct

__all__ = ["PORT", "BridgeClosed", "hand_over", "loopback_up", "proxy_env"]

#: Where a job reaches the proxy, in its own network namespace.
PORT = 3128
_SIOCGIFFLAGS, _SIOCSIFFLAGS = 0x8913, 0x8914
_IFF_UP, _IFF_RUNNING = 0x1, 0x40


class BridgeClosed(OSError):
    """The supervisor closed its end of the bridge before the worker handed
    its listener over: it gave up on this worker (its queue is closing)."""


def loopback_up() -> None:
    """Bring up the loopback interface of this (new) network namespace. Raises ``OSError``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP | _IFF_RUNNING))


def hand_over(bridge_fd: int) -> None:
    """In the worker, in its network namespace: loopback up, a listener on
    ``127.0.0.1:PORT`` handed to the supervisor over ``bridge_fd``; both
    closed here after. Raises ``OSError`` naming the step that failed."""
    try:
        loopback_up()
    except OSError as exc:
        raise OSError(exc.errno, f"bringing up loopback in the job's network namespace: {exc.strerror}") from None
    bridge = socket.socket(fileno=bridge_fd)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", PORT))
            listener.listen(128)
            try:
                socket.send_fds(bridge, [b"L"], [listener.fileno()])
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise BridgeClosed(exc.errno, "the supervisor closed its end of the bridge") from None
    finally:
        bridge.close()


def proxy_env() -> dict[str, str]:
    """What a job's environment says so that urllib, requests, httpx, pip and
    curl send everything through the proxy: both spellings (curl reads only
    the lower-case ``http_proxy``), and an empty ``NO_PROXY`` (an inherited
    one would send those hosts around it, to nothing). ``ALL_PROXY`` names
    the proxy as an HTTP one too: as ``socks5h://`` (which it also serves,
    at the same address) httpx would refuse to start without ``socksio``."""
    http = f"http://127.0.0.1:{PORT}"
    env = {"HTTP_PROXY": http, "HTTPS_PROXY": http, "ALL_PROXY": http, "NO_PROXY": ""}
    return {**env, **{name.lower(): value for name, value in env.items()}}
