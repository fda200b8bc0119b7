"""The sandbox's side of an allow-listed network (``Sandbox(network=[...])``).

A sandboxed worker with an allow-list gets a network namespace of its own,
as one without network does: no interface but loopback, and no route out.
Once there, before it drops its privileges, it brings loopback up (letting
it carry packets larger than 64 KiB where the kernel allows: the proxy's
writes to a job cost about half as much then), listens on
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

import contextlib
import fcntl
import os
import socket
import struct

__all__ = ["PORT", "SEGMENT", "BridgeClosed", "hand_over", "large_segments", "loopback_up", "proxy_env"]

#: Where a job reaches the proxy, in its own network namespace.
PORT = 3128
_SIOCGIFFLAGS, _SIOCSIFFLAGS = 0x8913, 0x8914
_IFF_UP, _IFF_RUNNING = 0x1, 0x40
# rtnetlink: a link's largest IPv4 GSO packet (Linux 6.3+; older kernels ignore the attribute).
_RTM_NEWLINK, _NLM_F_REQUEST, _NLM_F_ACK, _NLMSG_ERROR = 16, 1, 4, 2
_IFLA_GSO_IPV4_MAX_SIZE = 63
#: The largest packet a job's loopback carries: as large as a loopback takes (its
#: ``tso_max_size``), eight times the 64 KiB it is given by default.
SEGMENT = 8 * 65535


class BridgeClosed(OSError):
    """The supervisor closed its end of the bridge before the worker handed
    its listener over: it gave up on this worker (its queue is closing)."""


def loopback_up() -> None:
    """Bring up the loopback interface of this (new) network namespace. Raises ``OSError``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP | _IFF_RUNNING))


def large_segments(size: int = SEGMENT) -> None:
    """Let this namespace's loopback carry TCP packets of up to ``size``
    bytes (IPv4 "BIG TCP"), as a device that offloads segmentation may.
    The proxy's writes to a job then cross it in a few large packets, not
    one per 64 KiB: measured here, one loopback connection moves twice the
    bytes a second, its writer spending half the CPU on each. Only this
    namespace's loopback changes, the one between the proxy and its jobs.
    Raises ``OSError`` (a kernel before 6.3 ignores the request)."""
    index = socket.if_nametoindex("lo")
    link = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, index, 0, 0)  # struct ifinfomsg: which link
    body = link + struct.pack("=HHI", 8, _IFLA_GSO_IPV4_MAX_SIZE, size)  # one attribute: what to set
    header = struct.pack("=IHHII", 16 + len(body), _RTM_NEWLINK, _NLM_F_REQUEST | _NLM_F_ACK, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as rtnl:
        rtnl.settimeout(5)
        rtnl.send(header + body)
        answer = rtnl.recv(4096)
    kind = struct.unpack_from("=H", answer, 4)[0] if len(answer) >= 20 else None
    error = -struct.unpack_from("=i", answer, 16)[0] if kind == _NLMSG_ERROR else 0
    if kind != _NLMSG_ERROR or error:
        raise OSError(error, f"setting the loopback's largest packet: {os.strerror(error) if error else 'no answer'}")


def hand_over(bridge_fd: int) -> None:
    """In the worker, in its network namespace: loopback up (carrying large
    packets where the kernel allows), a listener on ``127.0.0.1:PORT``
    handed to the supervisor over ``bridge_fd``; both closed here after.
    Raises ``OSError`` naming the step that failed."""
    try:
        loopback_up()
    except OSError as exc:
        raise OSError(exc.errno, f"bringing up loopback in the job's network namespace: {exc.strerror}") from None
    with contextlib.suppress(OSError):
        large_segments()  # faster; never required
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
