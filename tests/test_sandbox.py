"""Sandboxed lanes: hostile jobs are refused what they were not given (files,
network, processes, privileges) and the lane keeps serving; ordinary jobs
still run (imports, programs, a private temporary directory, results,
errors, crashes, limits); bad input is refused when the Sandbox or Lane is made."""

from __future__ import annotations

import ast
import json
import logging
import os
import select
import signal
import socket
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jobs
import jobs_control
import jobs_sandbox as js
import pytest
from core_support import WAIT, failure_of, open_queue, procq_run

from procq import Job, Lane, ProcQueue, Sandbox, SandboxUnavailable
from procq._model.sandbox import PARTS
from procq._model.sandbox_bounds import BOUNDS
from procq._system.sandbox import kernel

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sandboxes are Linux's")

SECRET = "AWS_SECRET=wJalrXUtnFEMI/K7MDENG"


@dataclass
class Area:
    secret: Path  # a file the job was not given
    outside: Path  # a directory the job was not given, holding a file
    readable: Path  # a read= directory, holding a file
    first: Path  # write= directories
    second: Path


@pytest.fixture
def area(tmp_path: Path) -> Area:
    a = Area(*(tmp_path / name for name in ("secret", "outside", "readable", "first", "second")))
    a.secret.write_text(SECRET)
    for d in (a.outside, a.readable, a.first, a.second):
        d.mkdir()
        (d / "file").write_text("original")
    return a


def _sandboxed(area: Area, **kwargs: Any) -> Lane:
    sandbox = Sandbox(read=(str(area.readable),), write=(str(area.first), str(area.second)))
    return Lane(workers=1, trusted=False, sandbox=sandbox, **kwargs)


@pytest.fixture
def queue(area: Area) -> Any:
    with open_queue({"s": _sandboxed(area)}) as q:
        yield q


def _serves(q: ProcQueue, n: int = 7) -> None:
    assert q.push_and_wait(Job(f"after:{os.urandom(4).hex()}", js.square, args=(n,)), timeout=WAIT) == n * n


def _refused(said: dict[str, str]) -> None:
    reached = {what: how for what, how in said.items() if not how.startswith("refused")}
    assert not reached, f"a sandboxed job reached: {reached}"


# --- files ---------------------------------------------------------------------------------------


def test_a_job_cannot_read_what_it_was_not_given(queue: ProcQueue, area: Area) -> None:
    given = str(area.readable / "file")
    paths = [str(area.secret), "/etc/shadow", f"/proc/{os.getpid()}/environ", str(area.outside / "file"), given]
    said = queue.push_and_wait(Job("read", js.read_files, args=(paths,)), timeout=WAIT)
    assert said.pop(given) == "reached: 'original'"
    _refused(said)
    _serves(queue)


@pytest.mark.parametrize("where", ["outside", "readable"])
def test_a_job_cannot_change_files_outside_its_write_paths(queue: ProcQueue, area: Area, where: str) -> None:
    directory = getattr(area, where)
    before = [(p.name, p.stat().st_mode, p.stat().st_mtime_ns) for p in sorted(directory.iterdir())]
    said = queue.push_and_wait(Job(f"change:{where}", js.change_files, args=(str(directory / "file"), str(directory))))
    _refused(said)
    assert [(p.name, p.stat().st_mode, p.stat().st_mtime_ns) for p in sorted(directory.iterdir())] == before
    assert (directory / "file").read_text() == "original"
    assert not os.listxattr(directory / "file")
    _serves(queue)


def test_a_job_may_create_rename_link_move_and_delete_in_its_write_paths(queue: ProcQueue, area: Area) -> None:
    said = queue.push_and_wait(Job("use", js.use_write_dirs, args=(str(area.first), str(area.second))), timeout=WAIT)
    assert said == {"first": ["file"], "second": ["b", "file"]}
    moved = area.second / "b"
    assert moved.read_text() == "a" and stat.S_IMODE(moved.stat().st_mode) == 0o600 and moved.stat().st_mtime == 0
    _serves(queue)


def test_an_untrusted_job_without_a_sandbox_may_rename_across_directories(tmp_path: Path) -> None:
    """A plain untrusted lane's Landlock domain handles REFER: os.replace into
    a subdirectory no longer fails with EXDEV."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with open_queue({"u": Lane(workers=1, trusted=False)}) as q:
        said = q.push_and_wait(Job("use", js.use_write_dirs, args=(str(tmp_path / "a"), str(tmp_path / "b"))))
    assert said == {"first": [], "second": ["b"]}


# --- network -------------------------------------------------------------------------------------


def test_a_job_reaches_no_network_and_no_unix_socket_outside_its_tree(queue: ProcQueue, tmp_path: Path) -> None:
    tcp = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    path = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path.bind(str(tmp_path / "listener.sock"))
    path.listen()
    abstract_name = f"\0procq-test-{os.getpid()}".encode()
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(abstract_name)
    abstract.listen()
    listeners = [tcp, udp, path, abstract]
    try:
        args = (tcp.getsockname()[1], udp.getsockname()[1], str(tmp_path / "listener.sock"), abstract_name)
        said = queue.push_and_wait(Job("network", js.network, args=args), timeout=WAIT)
        _refused(said)
        # The job has returned: anything it managed to send would be waiting now.
        readable, _, _ = select.select(listeners, [], [], 0)
        assert readable == [], "a listener of the test heard from the job"
        assert queue.push_and_wait(Job("own", js.own_unix_socket), timeout=WAIT) == "ping"
        assert queue.push_and_wait(Job("child", js.child_connects, args=(args[0],)), timeout=WAIT).startswith("refused")
        assert select.select(listeners, [], [], 0)[0] == []
    finally:
        for s in listeners:
            s.close()
    _serves(queue)


# --- processes and privileges ---------------------------------------------------------------------


def test_a_job_cannot_see_signal_trace_or_read_the_supervisor(queue: ProcQueue) -> None:
    got: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: got.append(signum))
    try:
        said = queue.push_and_wait(Job("processes", js.processes, args=(os.getpid(),)), timeout=WAIT)
        pids = queue.push_and_wait(Job("pids", js.visible_pids), timeout=WAIT)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    _refused(said)
    assert got == []
    # Its own PID namespace: its worker (1) and its own process, nothing of the host.
    assert os.getpid() not in pids and len(pids) <= 3 and 1 in pids, pids
    _serves(queue)


def test_a_job_left_running_is_ended_with_its_job(queue: ProcQueue) -> None:
    left = queue.push_and_wait(Job("leave", js.leave_child_running), timeout=WAIT)
    assert left not in queue.push_and_wait(Job("pids", js.visible_pids), timeout=WAIT)


def test_a_job_cannot_gain_a_privilege(queue: ProcQueue) -> None:
    said = queue.push_and_wait(Job("privileges", js.privileges), timeout=WAIT)
    _refused(said)
    assert said["unshare user"].startswith("refused: PermissionError"), said
    assert queue.push_and_wait(Job("child userns", js.child_user_namespace), timeout=WAIT) == "-1 1"
    _serves(queue)


# --- what still works ---------------------------------------------------------------------------


def test_ordinary_jobs_run_with_a_private_temporary_directory(queue: ProcQueue) -> None:
    first = queue.push_and_wait(Job("ordinary:1", js.ordinary, args=("one",)), timeout=60)
    tmp = first["tmp"]
    assert tmp.startswith("/tmp/procq-job-") and first["env tmp"] == tmp
    assert "scratch" in first["listing"] and "db.sqlite" in first["listing"]
    assert first["true"] == 0
    assert first["child"] == [tmp, 3]  # a fresh interpreter, with the job's TMPDIR
    assert first["modules"][0] == "lzma"
    second = queue.push_and_wait(Job("ordinary:2", js.temp_exists, args=(tmp,)), timeout=WAIT)
    assert second == {"exists": False, "tmp": second["tmp"]} and second["tmp"] != tmp
    assert not os.path.exists(tmp)  # nor on the host: it was never there


def test_threads_and_process_pools_run_with_a_private_shared_memory(queue: ProcQueue) -> None:
    first = queue.push_and_wait(Job("pools:1", js.pools, args=("one",)), timeout=60)
    assert first == {"found": [], "thread": [1], "pool": [1, 2], "executor": [3]}
    second = queue.push_and_wait(Job("pools:2", js.pools, args=("two",)), timeout=60)
    assert second["found"] == []  # what the first job left is gone
    assert not os.path.exists("/dev/shm/one")  # and was never the host's


def test_a_program_the_job_starts_inherits_the_sandbox(queue: ProcQueue, area: Area) -> None:
    said = queue.push_and_wait(Job("child", js.child_reads, args=(str(area.secret),)), timeout=60)
    assert said.startswith("refused"), said
    _serves(queue)


def test_errors_crashes_and_limits_still_end_jobs(area: Area) -> None:
    with open_queue({"s": _sandboxed(area, memory_limit="64M")}) as q:
        failure = failure_of(q.push(Job("raise", js.fail, args=("boom",))).handle, "error")
        assert failure.message == "ValueError: boom"
        failure = failure_of(q.push(Job("crash", js.crash)).handle, "crashed")
        assert failure.signal == "SIGABRT"
        # The memory limit is the job's own: its worker (two processes here) does not count.
        assert q.push_and_wait(Job("within", jobs_control.allocate, args=(48,)), timeout=WAIT) == 48 << 20
        failure = failure_of(q.push(Job("greedy", jobs_control.allocate, args=(100,))).handle, "memory")
        failure = failure_of(q.push(Job("forever", jobs.block_forever, timeout=1.0)).handle, "timeout")
        _serves(q)
        assert q.stats().lanes["s"].sandbox is not None


# --- what the lane says it enforces ----------------------------------------------------------------


def test_stats_and_the_log_say_what_each_sandboxed_lane_enforces(area: Area, caplog: Any) -> None:
    lanes = {"s": _sandboxed(area), "plain": Lane(trusted=False)}
    with caplog.at_level(logging.DEBUG, logger="procq.worker"), open_queue(lanes) as q:
        stats = q.stats().lanes
        assert stats["plain"].sandbox is None
        enforced = stats["s"].sandbox
        assert enforced is not None and set(enforced) == set(PARTS + BOUNDS)
        assert "Landlock" in enforced["files"] and "seccomp" in enforced["privileges"]
    said = [r.getMessage() for r in caplog.records if "is sandboxed" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("lane 's' is sandboxed: files: Landlock ABI"), said


def test_network_true_leaves_the_network(area: Area) -> None:
    with open_queue({"s": Lane(trusted=False, sandbox=Sandbox(network=True))}) as q:
        tcp = socket.create_server(("127.0.0.1", 0))
        with tcp:
            said = q.push_and_wait(Job("net", js.child_connects, args=(tcp.getsockname()[1],)), timeout=60)
        assert said == "reached"
        assert "network" not in (q.stats().lanes["s"].sandbox or {})
        assert q.push_and_wait(Job("resolve", js.resolve, args=("localhost",)), timeout=60) == ["127.0.0.1"]


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"read": "/usr"}, TypeError, "Sandbox read must be a tuple of paths, got str"),
        ({"read": ("usr",)}, ValueError, "Sandbox read path 'usr' is relative"),
        ({"write": ("/no/such/dir",)}, ValueError, "Sandbox write path '/no/such/dir' does not exist"),
        ({"write": ("/etc/hostname",)}, ValueError, "Sandbox write path '/etc/hostname' is a file, not a directory"),
        ({"read": ("/",)}, ValueError, "Sandbox read path '/' is the whole filesystem"),
        ({"read": (3,)}, TypeError, "Sandbox read paths must be str or os.PathLike, got int"),
        ({"network": "no"}, TypeError, "Sandbox network must be False, True or a list of allowed hosts, got str"),
        ({"relax": ("speed",)}, ValueError, "Sandbox relax: unknown part 'speed'"),
    ],
)
def test_bad_sandboxes_are_refused_when_made(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Sandbox(**kwargs)


def test_a_sandbox_needs_an_untrusted_lane() -> None:
    with pytest.raises(ValueError, match=r"lane sandbox needs an untrusted lane"):
        Lane(sandbox=True)
    with pytest.raises(TypeError, match=r"lane sandbox must be a procq\.Sandbox, True or None, got str"):
        Lane(trusted=False, sandbox="yes")  # type: ignore[arg-type]
    assert Lane(trusted=False, sandbox=True).sandbox == Sandbox()
    assert Lane(trusted=False, sandbox=False).sandbox is None
    assert Sandbox(read=(Path("/usr"), "/usr/"), relax="namespaces") == Sandbox(read=("/usr",), relax=("namespaces",))


def test_this_machine_enforces_every_part() -> None:
    """The other tests run every part here; the probe must find them all."""
    k = kernel()
    assert k["landlock"] >= 6 and k["seccomp"] is None and k["namespaces"] is None, k
    _ = SandboxUnavailable


# --- the command line -----------------------------------------------------------------------------


def test_procq_run_sandbox_reads_only_what_it_is_given(area: Area) -> None:
    paths = [str(area.secret), str(area.readable / "file")]
    done = procq_run("jobs_sandbox:read_files", "--sandbox", "--read", str(area.readable), "--write", str(area.first),
                "-q", stdin=json.dumps(paths) + "\n")  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)["output"]
    assert said[str(area.readable / "file")] == "reached: 'original'"
    assert said[str(area.secret)].startswith("refused"), said


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--read", "/usr"], "--read needs --sandbox"),
        (["--sandbox", "--write", "/no/such/dir"], "Sandbox write path '/no/such/dir' does not exist"),
    ],
)
def test_procq_run_refuses_bad_sandbox_options(args: list[str], message: str) -> None:
    done = procq_run("jobs_sandbox:square", *args, stdin="3\n")
    assert done.returncode == 2 and message in done.stderr, done.stderr


# A program run from a file directly in /tmp: /tmp is then on its import path,
# where the sandbox's own private /tmp is in every job's view.
FROM_TMP = """
import os, sys, tempfile
from procq import Job, Lane, ProcQueue, Sandbox

def use_tmp(text):
    with tempfile.NamedTemporaryFile("w", delete=False) as f:
        f.write(text)
    with open(f.name) as f:
        return [os.path.dirname(f.name), f.read(), os.path.exists({script!r})]

if __name__ == "__main__":
    with ProcQueue({{"jail": Lane(workers=1, trusted=False, sandbox=Sandbox())}}) as q:
        print("RESULT", q.push_and_wait(Job("tmp", use_tmp, args=("written",)), timeout=60))
"""


def test_a_program_run_from_tmp_uses_a_sandboxed_lane(tmp_path: Path) -> None:
    script = Path("/tmp") / f"procq-from-tmp-{os.getpid()}-{os.urandom(4).hex()}.py"
    script.write_text(FROM_TMP.format(script=str(script)))
    root = str(Path(__file__).resolve().parent.parent)
    try:
        proc = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
            env=dict(os.environ, PYTHONPATH=root),
        )  # fmt: skip
    finally:
        script.unlink()
    assert proc.returncode == 0, proc.stderr
    # The job's own /tmp, private: it writes there (its TMPDIR), and sees nothing of the host's (the script).
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    where, text, sees_script = ast.literal_eval(line[len("RESULT ") :])
    assert where.startswith("/tmp/procq-job-") and text == "written" and sees_script is False, line
