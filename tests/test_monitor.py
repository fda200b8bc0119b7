"""The monitor's socket: only with ``monitor=True``, only for its user, gone
when the queue closes, and a client that stalls slows nothing."""

from __future__ import annotations

import gc
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import jobs
import pytest
from core_support import WAIT, wait_until

import procq._api.monitor
from procq import Job, ProcQueue, ProcQueueError
from procq._api.monitor import fetch, find, runtime_dir


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A runtime directory of the test's own ($XDG_RUNTIME_DIR), in /tmp (mode 0700),
    and a fallback directory of its own (where a queue goes without $XDG_RUNTIME_DIR)."""
    base = tempfile.mkdtemp(prefix="procq-runtime-")
    monkeypatch.setenv("XDG_RUNTIME_DIR", base)
    monkeypatch.setattr(procq._api.monitor, "_fallback_dir", lambda: os.path.join(base, "fallback"))
    try:
        yield os.path.join(base, "procq")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def monitor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("procq-monitor-")]


def test_a_queue_without_monitor_opens_no_socket(runtime: str) -> None:
    with ProcQueue(1) as q:
        assert q.push_and_wait(Job("a", jobs.square, args=(3,)), timeout=WAIT) == 9
        assert find() == [] and not os.path.exists(runtime)
        assert monitor_threads() == []


def test_the_socket_is_the_users_alone_and_closing_removes_it(runtime: str) -> None:
    assert runtime_dir() == runtime
    with ProcQueue(1, monitor=True, name="mine") as q:
        (path,) = find(os.getpid())
        assert os.path.dirname(path) == runtime
        info, folder = os.stat(path), os.stat(runtime)
        assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.getuid()
        assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == os.getuid()
        snap = fetch(path)
        assert snap["name"] == "mine" and snap["pid"] == os.getpid() and snap["stats"] == q.stats().to_dict()
    assert find(os.getpid()) == [] and not os.path.exists(path)
    assert monitor_threads() == []


def test_a_queue_nobody_closed_removes_its_socket_when_collected(runtime: str) -> None:
    q = ProcQueue(1, monitor=True)
    (path,) = find(os.getpid())
    del q
    gc.collect()
    assert not os.path.exists(path) and monitor_threads() == []


_CLIENT = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
try:
    s.connect(sys.argv[1])
except PermissionError:
    print("refused"); sys.exit()
print("answered" if s.recv(65536) else "closed unanswered")
"""


def run_as_nobody(python: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, *args], user=65534, group=65534, extra_groups=[], cwd="/",
        capture_output=True, text=True, timeout=WAIT,
    )  # fmt: skip


def nobodys_python() -> str:
    """An interpreter the user nobody may run (this one may live in root's home)."""
    for python in (sys.executable, getattr(sys, "_base_executable", ""), "/usr/bin/python3"):
        try:
            if python and run_as_nobody(python, "-c", "pass").returncode == 0:
                return python
        except OSError:
            continue
    pytest.skip("no Python interpreter that the user nobody may run")


@pytest.mark.skipif(os.geteuid() != 0, reason="running a client as another user (nobody) needs root")
def test_another_user_cannot_connect(runtime: str) -> None:
    python = nobodys_python()

    def as_nobody(path: str) -> str:
        done = run_as_nobody(python, "-c", _CLIENT, path)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    with ProcQueue(1, monitor=True) as q:
        (path,) = find(os.getpid())
        assert as_nobody(path) == "refused"
        # Opened up by hand, the socket still answers only its user (SO_PEERCRED).
        os.chmod(os.path.dirname(os.path.dirname(path)), 0o711)
        os.chmod(runtime, 0o711)
        os.chmod(path, 0o666)
        assert as_nobody(path) == "closed unanswered"
        assert fetch(path)["stats"] == q.stats().to_dict()  # and its user still gets answers


def test_a_stalled_client_slows_nothing(runtime: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A snapshot far larger than a socket's buffer, so a client that reads nothing holds a send open.
    real = procq._api.monitor.snapshot
    monkeypatch.setattr(procq._api.monitor, "snapshot", lambda *args: {**real(*args), "pad": "x" * 4_000_000})
    monkeypatch.setattr(procq._api.monitor, "SEND_TIMEOUT", 1.0)
    with ProcQueue(2, monitor=True) as q:
        (path,) = find(os.getpid())
        stalled = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(3)]
        try:
            for s in stalled:
                s.connect(path)
            # The queue runs, its lock is free, and another client is served meanwhile.
            handles = [q.push(Job(f"j{i}", jobs.square, args=(i,))).handle for i in range(200)]  # type: ignore[union-attr]
            assert [h.result(timeout=WAIT) for h in handles] == [i * i for i in range(200)]
            assert fetch(path, timeout=WAIT)["stats"]["completed"] == 200
            # Past SEND_TIMEOUT a stalled client is dropped: it reads what was buffered, then EOF.
            monitor = q._monitor
            assert monitor is not None
            wait_until(lambda: monitor.serving == 0, what="the stalled clients dropped")
            s = stalled[0]
            s.settimeout(WAIT)
            got = 0
            while chunk := s.recv(1 << 20):
                got += len(chunk)
            assert 0 < got < 4_000_000
        finally:
            for s in stalled:
                s.close()


def test_two_queues_of_one_name_are_both_seen(runtime: str) -> None:
    with ProcQueue(1, monitor=True, name="twin") as a, ProcQueue(1, monitor=True, name="twin") as b:
        paths = find(os.getpid())
        assert len(paths) == 2
        assert sorted(fetch(p)["stats"]["lanes"]["default"]["workers"] for p in paths) == [1, 1]
        a.close()
        assert find(os.getpid()) == [p for p in paths if os.path.exists(p)] and len(find(os.getpid())) == 1
        assert fetch(find(os.getpid())[0])["stats"] == b.stats().to_dict()


def test_a_store_queues_snapshot_counts_its_rows(runtime: str, tmp_path: Path) -> None:
    with ProcQueue(1, monitor=True, store=str(tmp_path / "keys.db")) as q:
        for i in range(3):
            assert q.push_and_wait(Job(f"s{i}", jobs.square, args=(i,)), timeout=WAIT) == i * i
        (path,) = find(os.getpid())
        snap = fetch(path)
        assert snap["stats"] == q.stats().to_dict() and snap["stats"]["completed"] == 3
        assert snap["store"]["available"] and snap["store"]["url"].startswith("sqlite")


def test_a_socket_path_too_long_is_refused_clearly_and_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    base = tempfile.mkdtemp(prefix="procq-runtime-")
    try:
        deep = os.path.join(base, "d" * 100)
        os.mkdir(deep, 0o700)
        monkeypatch.setenv("XDG_RUNTIME_DIR", deep)
        with pytest.raises(ProcQueueError, match=r"longer than a UNIX socket's 107 bytes; set XDG_RUNTIME_DIR"):
            ProcQueue(1, monitor=True)
        assert monitor_threads() == [] and os.listdir(os.path.join(deep, "procq")) == []
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_runtime_directory_of_another_user_is_refused(runtime: str) -> None:
    os.symlink(tempfile.gettempdir(), runtime)  # a link, as another user could plant
    with pytest.raises(ProcQueueError, match="is not a directory of this user"):
        ProcQueue(1, monitor=True)
    assert monitor_threads() == []


def test_top_also_looks_where_xdg_runtime_dir_was_not_set(runtime: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR")  # a queue started by a service, say
    with ProcQueue(1, monitor=True, name="service"):
        monkeypatch.setenv("XDG_RUNTIME_DIR", os.path.dirname(runtime))  # and looked for from a login shell
        (path,) = find(os.getpid())
        assert path.startswith(os.path.join(os.path.dirname(runtime), "fallback"))
        assert fetch(path)["name"] == "service"
