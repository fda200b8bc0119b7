"""What a worker starts with, trusted or untrusted: its lane's environment variables (inherited from
the supervisor or not) and working directory, and no descriptor but its own pipes."""

from __future__ import annotations

import os
from typing import Any

import jobs
import jobs_control
import pytest
from core_support import WAIT, Gates, hold, open_queue
from process_support import linux_only

from procq import Job, Lane

pytestmark = pytest.mark.skipif(not linux_only, reason="job control relies on Linux process groups and /proc")


@pytest.mark.parametrize(
    ("method", "trusted"),
    [
        pytest.param("forkserver", True, id="forkserver-trusted"),
        pytest.param("spawn", True, id="spawn-trusted"),
        pytest.param(None, False, id="untrusted"),
    ],
)
def test_env_and_cwd(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, method: str | None, trusted: bool) -> None:
    # Start the forkserver (if it is not yet running) before the variable
    # below is set: workers must see the supervisor's environment as it is now.
    with open_queue(1, start_method=method) as q:
        q.push_and_wait(Job("warm", jobs.square, args=(1,)), timeout=WAIT)
    monkeypatch.setenv("PROCQ_TEST_SUPERVISOR_VAR", "from-the-supervisor")
    given = {"PROCQ_TEST_GIVEN": "given", "PROCQ_TEST_SUPERVISOR_VAR": "overridden-by-the-lane"}
    lanes = {
        "default": Lane(trusted=trusted),
        "given": Lane(trusted=trusted, env=given, cwd=tmp_path),
        "clean": Lane(trusted=trusted, env={"ONLY": "this"}, inherit_env=False),
        "inherit": Lane(trusted=trusted, env={"ALSO": "this"}, inherit_env=True),
    }
    with open_queue(lanes, start_method=method) as q:

        def env(lane: str) -> dict[str, str]:
            return q.push_and_wait(Job(f"env-{lane}", jobs_control.environ, lane=lane), timeout=WAIT)  # type: ignore[no-any-return]

        # Only the lane's own variables, or the supervisor's (PATH, HOME, ...) too.
        assert env("clean") == {"ONLY": "this"}
        inherited = env("inherit")
        assert inherited["ALSO"] == "this"
        for name in ("PATH", "HOME", "PROCQ_TEST_SUPERVISOR_VAR"):
            assert inherited.get(name) == os.environ.get(name), name
        given_env = env("given")
        assert given_env["PROCQ_TEST_GIVEN"] == "given"
        assert given_env["PROCQ_TEST_SUPERVISOR_VAR"] == "overridden-by-the-lane"
        # By default a trusted lane inherits the supervisor's environment, an untrusted one does not.
        default = env("default")
        if trusted:
            assert given_env.get("PATH") == default.get("PATH") == os.environ.get("PATH")
            assert default.get("PROCQ_TEST_SUPERVISOR_VAR") == "from-the-supervisor"
        else:
            assert default == {}
            assert given_env == given

        assert q.push_and_wait(Job("cwd", jobs_control.getcwd, lane="given"), timeout=WAIT) == str(tmp_path)
        assert q.push_and_wait(Job("cwd-default", jobs_control.getcwd, lane="default"), timeout=WAIT) == os.getcwd()


@pytest.mark.parametrize(
    ("method", "trusted", "nofile"),
    [
        ("forkserver", True, None),
        ("spawn", True, None),
        (None, False, None),
        # A tight descriptor limit must not stop the worker from closing what it inherited.
        ("forkserver", True, 5),
        ("spawn", True, 5),
        (None, False, 5),
    ],
    ids=["forkserver-trusted", "spawn-trusted", "untrusted", "forkserver-nofile", "spawn-nofile", "untrusted-nofile"],
)
def test_a_worker_inherits_no_descriptor_but_its_pipes(
    tmp_path: Any, method: str | None, trusted: bool, nofile: int | None, gates: Gates
) -> None:
    """The worker holds stdio, its own pipe (a socket) and one pipe that tells
    it the supervisor died: nothing the supervisor had open, not even a file
    it made inheritable, and not another worker's pipe."""
    secret = tmp_path / "secret"
    fd = os.open(secret, os.O_CREAT | os.O_RDWR, 0o600)
    os.set_inheritable(fd, True)
    try:
        rlimits = None if nofile is None else {"nofile": nofile}
        with open_queue({"t": Lane(workers=2, trusted=trusted, rlimits=rlimits)}, start_method=method) as q:
            first, _, go = hold(q, gates, "busy")  # so the next job runs on the other worker
            fds = q.push_and_wait(Job("fds", jobs_control.open_fds), timeout=WAIT)
            go.open()
            first.result(timeout=WAIT)
    finally:
        os.close(fd)
    fds = {int(k): v for k, v in fds.items()}
    assert str(secret) not in fds.values(), fds
    extra = {k: v for k, v in fds.items() if k > 2}
    assert len(extra) <= 2, fds
    # Its pipe to the supervisor is its only socket; the other is a pipe (the supervisor's liveness).
    assert sorted(v.split(":")[0] for v in extra.values()) in (["socket"], ["pipe", "socket"]), fds
