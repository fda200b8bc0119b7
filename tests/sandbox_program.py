"""A supervisor for test_sandbox_users, run as a program of its own:

- ``nobody DIR``: started as root, it becomes ``nobody`` (uid and gid
  65534, no supplementary group) and opens a sandboxed lane as that
  ordinary user. First, in a mount namespace of its own, it makes the
  directories on the way to the interpreter that ``nobody`` may not enter
  (``/root`` when Python lives under it) passable, as a read-only bind of
  what they lead to over an empty tmpfs: nothing else of them is visible.
- ``no-userns DIR``: it enters a user namespace of its own and sets
  ``user.max_user_namespaces`` to 0 there, as distributions that disable
  user namespaces do: from then on the kernel refuses it (and its
  children) any new user namespace. A sandboxed lane must then refuse to
  open, unless its Sandbox relaxes ``namespaces``, and then ``max_tmp``
  (its temporary directory is the host's without them).

As ``nobody`` it also runs the bounds' hostile jobs (``jobs_bounds``).

Either way it prints, as the last line of its output, a JSON object of
what it saw.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from typing import Any

_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_MS_BIND, _MS_REC, _MS_PRIVATE, _MS_RDONLY, _MS_REMOUNT = 4096, 16384, 1 << 18, 1, 32
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _passable_for_others(paths: list[str]) -> None:
    """(As root.) Make every directory on the way to ``paths`` passable for
    other users, in a mount namespace of this process only."""
    _check(_libc.unshare(_CLONE_NEWNS), "unshare")
    _check(_libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "mount private")
    done: set[str] = set()
    for path in paths:
        prefix = ""
        parts = path.strip("/").split("/")
        for i, part in enumerate(parts[:-1]):
            prefix += "/" + part
            if prefix in done or os.stat(prefix).st_mode & 0o001:
                continue
            child = prefix + "/" + parts[i + 1]
            fd = os.open(child, os.O_PATH | os.O_CLOEXEC)
            _check(_libc.mount(b"tmpfs", prefix.encode(), b"tmpfs", 0, b"mode=0755"), f"tmpfs on {prefix}")
            os.mkdir(child)
            _check(_libc.mount(f"/proc/self/fd/{fd}".encode(), child.encode(), None, _MS_BIND | _MS_REC, None), child)
            os.close(fd)
            done.add(prefix)


def _become_nobody() -> None:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


def _no_user_namespaces() -> None:
    uid, gid = os.geteuid(), os.getegid()
    _check(_libc.unshare(_CLONE_NEWUSER), "unshare")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    with open("/proc/sys/user/max_user_namespaces", "w") as f:
        f.write("0")


def _ended(pid: int) -> bool:
    """Has the process ``pid`` exited (reaped, or a zombie)?"""
    import select

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], 0)[0])
    finally:
        os.close(fd)


def _scenario(directory: str, leftover: bool = False, **sandbox: Any) -> dict[str, Any]:
    import jobs_sandbox as js

    from procq import Job, Lane, ProcQueue, Sandbox

    secret, out = os.path.join(directory, "secret"), os.path.join(directory, "out")
    lane = Lane(workers=1, trusted=False, sandbox=Sandbox(write=(out,), **sandbox))
    with ProcQueue({"s": lane}) as q:
        if leftover:  # (its pid is the host's only without a PID namespace)
            pid = q.push_and_wait(Job("leave", js.leave_child_running), timeout=60)
            ended = _ended(pid)
            if not ended:
                os.kill(pid, 9)
        return (
            {"leftover ended": ended}
            if leftover
            else {
                "uid": os.getuid(),
                "supervisor reads": open(secret).read(),
                "job reads": q.push_and_wait(Job("read", js.read_files, args=([secret, "/etc/shadow"],)), timeout=60),
                "job writes": q.push_and_wait(Job("write", js.use_write_dirs, args=(out, out)), timeout=60),
                "ordinary": q.push_and_wait(Job("ordinary", js.ordinary, args=("x",)), timeout=60),
                "enforced": sorted(q.stats().lanes["s"].sandbox or {}),
            }
        )


def _bounds() -> dict[str, Any]:
    """The bounds' hostile jobs, each in a lane of its own, each followed by an ordinary job."""
    import jobs_bounds as jb
    import jobs_sandbox as js

    from procq import Job, JobFailed, Lane, ProcQueue, Sandbox, SandboxUnavailable

    said: dict[str, Any] = {}
    cases: dict[str, tuple[Lane, Any, tuple[Any, ...]]] = {
        "max_processes": (Lane(trusted=False, sandbox=Sandbox(max_processes=16)), jb.fork_bomb, ()),
        "nproc": (Lane(trusted=False, sandbox=Sandbox(), rlimits={"nproc": 16}), jb.fork_bomb, ()),
        "max_tmp": (Lane(trusted=False, sandbox=Sandbox(max_tmp="64M")), jb.fill_tmp, (300,)),
        "relaxed max_memory": (
            Lane(trusted=False, sandbox=Sandbox(max_memory="48M", relax=("max_memory",))),
            jb.hog,
            (64,),
        ),
        "memory_limit": (Lane(trusted=False, sandbox=Sandbox(), memory_limit="64M"), jb.hog, (256,)),
    }
    bound = {"nproc": "max_processes", "relaxed max_memory": "max_memory", "memory_limit": "max_memory"}
    for name, (lane, fn, args) in cases.items():
        with ProcQueue({"s": lane}) as q:
            try:
                did: Any = q.push_and_wait(Job(name, fn, args=args), timeout=60)
            except JobFailed as exc:
                did = {"failed": exc.failure.kind, "message": exc.failure.message}
            said[name] = {
                "did": did,
                "next": q.push_and_wait(Job("next", js.square, args=(7,)), timeout=60),
                "enforced": (q.stats().lanes["s"].sandbox or {}).get(bound.get(name, name), "(relaxed)"),
            }
    try:
        ProcQueue({"s": Lane(trusted=False, sandbox=Sandbox(max_memory="48M"))}).close()
        said["max_memory"] = "opened"
    except SandboxUnavailable as exc:
        said["max_memory"] = {"part": exc.part, "message": str(exc)}
    return said


def _egress() -> dict[str, Any]:
    """A lane with a network allow-list: urllib and curl reach the listed
    server (127.0.0.2) and are refused the other (127.0.0.3)."""
    import http.server
    import threading

    import jobs_egress as je
    from egress_servers import Hello

    from procq import Job, Lane, ProcQueue, Sandbox

    servers = [http.server.ThreadingHTTPServer((host, 0), Hello) for host in ("127.0.0.2", "127.0.0.3")]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    listed, other = (f"http://{s.server_address[0]}:{s.server_address[1]}/" for s in servers)
    try:
        lane = Lane(workers=1, trusted=False, sandbox=Sandbox(network=[listed[7:-1]]))
        with ProcQueue({"s": lane}) as q:
            return {
                "urllib": [
                    q.push_and_wait(Job(f"u{i}", je.fetch, args=(url,)), timeout=60)
                    for i, url in enumerate((listed, other))
                ],
                "curl": [
                    q.push_and_wait(Job(f"c{i}", je.curl, args=("-f", url)), timeout=60)
                    for i, url in enumerate((listed, other))
                ],
            }
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def main() -> None:
    mode, directory, here, root = sys.argv[1:5]
    if mode == "nobody":
        _passable_for_others([os.path.realpath(sys.executable), sys.executable, here, root])
        _become_nobody()
    else:
        _no_user_namespaces()
    sys.path[:0] = [root, here]
    said: dict[str, Any] = {}
    if mode == "nobody":
        said = _scenario(directory)
        said["bounds"] = _bounds()
        said["egress"] = _egress()
    else:
        from procq import SandboxUnavailable

        try:
            _scenario(directory)
            said["strict"] = "opened"
        except SandboxUnavailable as exc:
            said["strict"] = {"part": exc.part, "message": str(exc)}
        try:
            _scenario(directory, relax=("namespaces",))
            said["without namespaces"] = "opened"
        except SandboxUnavailable as exc:
            said["without namespaces"] = {"part": exc.part, "message": str(exc)}
        said["relaxed"] = _scenario(directory, relax=("namespaces", "max_tmp"))
        said["relaxed"].update(_scenario(directory, leftover=True, relax=("namespaces", "max_tmp")))
        try:
            _scenario(directory, network=["pypi.org"], relax=("namespaces", "max_tmp"))
            said["allow-list"] = "opened"
        except SandboxUnavailable as exc:
            said["allow-list"] = {"part": exc.part, "message": str(exc)}
    print()
    print(json.dumps(said))


if __name__ == "__main__":
    main()
