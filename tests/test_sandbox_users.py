"""A sandboxed lane whose supervisor runs as an ordinary user (``nobody``),
and one where the kernel refuses user namespaces: ``SandboxUnavailable``
unless the Sandbox relaxes them. Each scenario runs as a program of its own
(``sandbox_program``): a uid, and a user namespace's limits, are a process's."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from process_support import json_program

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sandboxes are Linux's")

HERE = Path(__file__).parent
SECRET = "AWS_SECRET=wJalrXUtnFEMI/K7MDENG"


@pytest.fixture
def shared() -> Iterator[str]:
    """A directory an ordinary user may read (pytest's tmp_path is root's
    alone): a secret any process of that user could read, and a directory it
    may write to."""
    directory = tempfile.mkdtemp(prefix="procq-sandbox-test-")
    try:
        os.chmod(directory, 0o755)
        with open(os.path.join(directory, "secret"), "w") as f:
            f.write(SECRET)
        os.chmod(os.path.join(directory, "secret"), 0o644)
        os.mkdir(os.path.join(directory, "out"))
        os.chmod(os.path.join(directory, "out"), 0o777)
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _run(mode: str, directory: str) -> dict[str, Any]:
    argv = [sys.executable, "-I", str(HERE / "sandbox_program.py"), mode, directory, str(HERE), str(HERE.parent)]
    return json_program(argv, 120)


def _sandboxed(said: dict[str, Any], directory: str) -> None:
    """What a job did in a lane with a sandbox: refused what it was not given, did the rest."""
    assert said["supervisor reads"] == SECRET  # its user may read it: the sandbox is what refuses the job
    reads = said["job reads"]
    assert all(how.startswith("refused") for how in reads.values()), reads
    assert said["job writes"] == {"first": ["b"], "second": ["b"]}
    assert os.path.exists(os.path.join(directory, "out", "b"))
    ordinary = said["ordinary"]
    assert ordinary["true"] == 0 and ordinary["child"] == [ordinary["tmp"], 3], ordinary
    assert not os.path.exists(ordinary["tmp"])


@pytest.mark.skipif(os.getuid() != 0, reason="becoming nobody needs root; as another user, every test is this one")
def test_a_supervisor_running_as_an_ordinary_user_sandboxes_its_jobs(shared: str) -> None:
    said = _run("nobody", shared)
    assert said["uid"] == 65534
    _sandboxed(said, shared)
    assert said["enforced"] == [
        "files", "max_memory", "max_processes", "max_tmp", "namespaces", "network", "privileges", "processes"
    ]  # fmt: skip
    assert os.stat(os.path.join(shared, "out", "b")).st_uid == 65534
    bounds = said["bounds"]
    for name in ("max_processes", "nproc"):  # RLIMIT_NPROC binds nobody, counted in the job's user namespace
        bomb = bounds[name]
        assert 1 < bomb["did"]["processes"] <= 16 and bomb["did"]["refused"] >= 1, bomb
        assert bomb["next"] == 49
        assert bomb["enforced"] == "RLIMIT_NPROC in the job's user namespace: at most 16 processes and threads"
    filler = bounds["max_tmp"]
    assert filler["did"]["error"] == "ENOSPC" and filler["did"]["written"] <= 64 and filler["next"] == 49, filler
    # nobody may make no memory cgroup here: a memory bound is refused unless relaxed, then not enforced.
    refused = bounds["max_memory"]
    assert isinstance(refused, dict) and refused["part"] == "max_memory", refused
    assert refused["message"].startswith("lane 's': the sandbox's max_memory bound cannot be enforced here: ")
    assert "Sandbox(relax=('max_memory',))" in refused["message"]
    relaxed = bounds["relaxed max_memory"]
    assert relaxed["did"] == 64 << 20 and relaxed["enforced"] == "(relaxed)", relaxed
    # Without a cgroup, the lane's memory_limit (max_memory's default) binds as in any untrusted lane.
    limited = bounds["memory_limit"]
    assert limited["did"]["failed"] == "memory" and limited["next"] == 49, limited
    assert limited["enforced"].startswith("the lane's memory_limit, as in any untrusted lane"), limited
    assert "64 MiB, its temporary files not included" in limited["enforced"], limited
    egress = said["egress"]
    assert egress["urllib"][0][0] == "ok" and egress["urllib"][0][1].startswith("hello from 127.0.0.2 for ")
    assert egress["urllib"][1] == ["refused", 403]
    assert egress["curl"][0][0] == 0 and egress["curl"][0][1].startswith("hello from 127.0.0.2 for ")
    assert egress["curl"][1][0] != 0


def test_where_user_namespaces_are_refused_a_sandbox_raises_unless_it_relaxes_them(shared: str) -> None:
    said = _run("no-userns", shared)
    strict = said["strict"]
    assert isinstance(strict, dict), f"a sandboxed lane opened without user namespaces: {strict}"
    assert strict["part"] == "namespaces"
    message = strict["message"]
    assert message.startswith("lane 's': the sandbox's namespaces part cannot be enforced here: ")
    assert "max_user_namespaces" in message and "ENOSPC" in message
    assert "kernel.apparmor_restrict_unprivileged_userns=0" in message
    assert "Sandbox(relax=('namespaces',))" in message
    unsized = said["without namespaces"]
    assert isinstance(unsized, dict) and unsized["part"] == "max_tmp", unsized
    assert "the job's temporary directory is in the host's" in unsized["message"]
    relaxed = said["relaxed"]
    _sandboxed(relaxed, shared)
    # Without a PID namespace, the worker's cgroup ends what a job left running (when it has one: root here).
    assert relaxed["leftover ended"] is ("max_processes" in relaxed["enforced"] and os.getuid() == 0)
    assert relaxed["enforced"] == ["files", "max_memory", "max_processes", "network", "privileges", "processes"]
    allow_list = said["allow-list"]
    assert isinstance(allow_list, dict), f"an allow-list opened without a network namespace: {allow_list}"
    assert allow_list["part"] == "network"
    assert allow_list["message"].startswith(
        "lane 's': the sandbox's network part cannot be enforced here: an allow-list needs a network namespace"
    )
