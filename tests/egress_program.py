"""A supervisor for test_egress_hostile, run as a program of its own, as
root (``root``) or as the ordinary user ``nobody`` (``nobody``: it becomes
uid and gid 65534 first, as ``sandbox_program`` does).

It starts servers on loopback addresses (a listed HTTP/1.1 server that keeps
every connection open and records each request it reads, a listed echo
server, an HTTP server off the list), then opens a queue with a sandboxed
lane whose network is an allow-list with a ``network_bytes`` of 1 MiB,
beside a trusted canary lane whose tiny job a thread pushes every 20 ms.
Each hostile job (``CASES``) runs twice; around the second run it reads
what the supervisor holds (open fds, threads, RSS), waiting (bounded) for
the proxy's threads to finish after the job. It also collects every
exception raised in a thread of the supervisor, every unraisable one, and
every ``ResourceWarning`` (a socket left for the collector), and the length
of every line the ``procq.sandbox`` logger wrote.

It prints, as the last line of its output, a JSON object of what it saw.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import threading
import time
import warnings
from typing import Any

ROUNDS = 2
NETWORK_BYTES = 1 << 20
SMUGGLED = "GET /second HTTP/1.1\r\nHost: evil.test\r\n\r\n"


def _held() -> dict[str, int]:
    import psutil

    me = psutil.Process()
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": threading.active_count(), "rss": me.memory_info().rss}


def _settled(before: dict[str, int]) -> dict[str, int]:
    """What the supervisor holds once the proxy's threads for the last job
    have ended (at most 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        now = _held()
        if (now["threads"] <= before["threads"] and now["fds"] <= before["fds"]) or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


class Canary:
    """A tiny job in the trusted lane every 20 ms, on a thread: the longest
    wait for an answer and their number, since the last ``take``."""

    def __init__(self, q: Any) -> None:
        self.q = q
        self.lock = threading.Lock()
        self.longest, self.answered, self.failed = 0.0, 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import jobs_sandbox as js

        from procq import Job

        i = 0
        while not self.stop.wait(0.02):
            i += 1
            began = time.monotonic()
            try:
                self.q.push_and_wait(Job(f"canary-{i}", js.square, args=(i,), lane="canary"), timeout=60)
                ok = True
            except Exception:
                ok = False
            with self.lock:
                self.longest = max(self.longest, time.monotonic() - began)
                self.answered += ok
                self.failed += not ok

    def take(self) -> dict[str, Any]:
        with self.lock:
            said = {"longest": self.longest, "answered": self.answered, "failed": self.failed}
            self.longest, self.answered, self.failed = 0.0, 0, 0
        return said


def _cases(keep: int, echo: int, other: int) -> dict[str, tuple[Any, tuple[Any, ...]]]:
    import jobs_egress as je

    listed = f"127.0.0.2:{keep}"
    first = f"GET /first HTTP/1.1\r\nHost: {listed}\r\n\r\n"
    return {
        "a port of digits that are not ASCII": (je.raw_http, ("GET http://127.0.0.2:\u00b2/ HTTP/1.1\r\n\r\n",)),
        "a request framed two ways": (
            je.raw_http,
            (f"POST http://{listed}/ HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",),
        ),
        "a head past its limit": (
            je.raw_http,
            (f"GET http://{listed}/ HTTP/1.1\r\nX-Filler: {'a' * (1 << 20)}\r\n\r\n",),
        ),
        "a second request after a checked one": (
            je.exchange,
            (f"GET http://{listed}/first HTTP/1.1\r\n\r\n" + SMUGGLED,),
        ),
        "a second request through SOCKS5": (je.socks_http, ("127.0.0.2", keep, first + SMUGGLED)),
        "another host through SOCKS5": (
            je.socks_http,
            ("127.0.0.2", keep, "GET /x HTTP/1.1\r\nHost: evil.test\r\n\r\n"),
        ),
        "request heads past network_bytes": (je.heavy_heads, (f"http://{listed}/x", 60, 40)),
        "refusals in a loop": (je.refusals, (2000, other)),
        "a handshake a byte at a time": (
            je.trickle,
            (f"GET http://{listed}/ HTTP/1.1\r\nX-Slow: {'p' * 64}\r\n\r\n", 0.1, 15.0),
        ),
        "a tunnel whose ClientHello never comes": (je.connect_then_wait, (f"127.0.0.2:{echo}", 15.0)),
        "the connection limit held open": (je.hold_tunnels, ("127.0.0.2", echo, 64, 1.0)),
    }


def _peak(stop: threading.Event, into: list[int]) -> None:
    import psutil

    me = psutil.Process()
    while not stop.wait(0.02):
        into[0] = max(into[0], me.memory_info().rss)


def _run_cases() -> dict[str, Any]:
    import http.server

    import jobs_sandbox as js
    from egress_servers import Echo, EchoServer, Hello, KeepAlive, RecordingServer

    from procq import Job, JobFailed, Lane, ProcQueue, Sandbox
    from procq._system import egress_conn

    egress_conn.HANDSHAKE_TIMEOUT = 2.0  # (the supervisor's: the deadline a trickled handshake meets)
    servers: list[Any] = [
        RecordingServer(("127.0.0.2", 0), KeepAlive),
        EchoServer(("127.0.0.2", 0), Echo),
        http.server.ThreadingHTTPServer(("127.0.0.3", 0), Hello),
    ]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    keep, echo, other = (s.server_address[1] for s in servers)
    sandbox = Sandbox(network=[f"127.0.0.2:{keep}", f"127.0.0.2:{echo}"], network_bytes=NETWORK_BYTES)
    lanes = {"s": Lane(workers=1, trusted=False, sandbox=sandbox), "canary": Lane(workers=1)}
    said: dict[str, Any] = {"uid": os.getuid(), "cases": {}}
    try:
        with ProcQueue(lanes) as q:
            q.push_and_wait(Job("warm", js.square, args=(2,), lane="s"), timeout=60)
            canary = Canary(q)
            try:
                for name, (fn, args) in _cases(keep, echo, other).items():
                    case: dict[str, Any] = {}
                    for round_ in range(ROUNDS):
                        before = _settled(_held())
                        seen = len(servers[0].seen)
                        canary.take()
                        peak, stop = [before["rss"]], threading.Event()
                        sampler = threading.Thread(target=_peak, args=(stop, peak), daemon=True)
                        sampler.start()
                        handle = q.push(Job(f"{name}-{round_}", fn, args=args, lane="s")).handle  # type: ignore[union-attr]
                        try:
                            result: Any = handle.result(timeout=120)
                        except JobFailed as exc:
                            result = {"failed": exc.failure.kind, "message": exc.failure.message[:300]}
                        stop.set()
                        sampler.join(10)
                        after = _settled(before)
                        case = {
                            "result": result,
                            "refused": [[r.what, r.why[:120], r.times] for r in handle.sandbox_refused()],
                            "seen": [list(s) for s in servers[0].seen[seen:]],
                            "canary": canary.take(),
                            "before": before,
                            "after": after,
                            "peak rss": peak[0],
                        }
                    said["cases"][name] = case
            finally:
                canary.stop.set()
                canary.thread.join(60)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
    return said


def main() -> None:
    mode, here, root = sys.argv[1:4]
    if mode == "nobody":
        sys.path[:0] = [here]
        from sandbox_program import _become_nobody, _passable_for_others

        _passable_for_others([os.path.realpath(sys.executable), sys.executable, here, root])
        _become_nobody()
    sys.path[:0] = [root, here]
    raised: list[str] = []
    threading.excepthook = lambda args: raised.append(f"{args.thread.name if args.thread else '?'}: {args.exc_value!r}")
    sys.unraisablehook = lambda args: raised.append(f"unraisable: {args.exc_value!r} in {args.object!r}")
    warned: list[str] = []
    warnings.simplefilter("always", ResourceWarning)
    warnings.showwarning = lambda message, *rest: warned.append(str(message)[:200])
    logged: list[int] = []  # the length of each line the sandbox's logger wrote
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(len(record.getMessage()))  # type: ignore[method-assign]
    logging.getLogger("procq.sandbox").addHandler(handler)
    said = _run_cases()
    gc.collect()  # a socket left for the collector warns now
    said["raised"], said["warned"], said["logged"] = raised, warned, logged
    print()
    print(json.dumps(said))


if __name__ == "__main__":
    main()
