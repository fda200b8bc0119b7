"""A sandbox's bounds, held against hostile jobs under this supervisor (root
here; ``nobody`` in test_sandbox_users): a fork bomb stops at
``max_processes`` (and at a lane's ``rlimits["nproc"]``), a disk filler at
``max_tmp`` with ``ENOSPC``, a memory hog at ``max_memory`` as kind
``"memory"``; each time the lane serves the next job, and no cgroup is left
behind once the queue is closed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jobs_bounds as jb
import jobs_sandbox as js
import pytest
from core_support import WAIT, open_queue

from procq import Job, JobFailed, Lane, ProcQueue, Sandbox, SandboxUnavailable
from procq._system import cgroups
from procq._wire.protocol import JobExit, ProtocolError, decode_untrusted

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sandboxes are Linux's")


def _ours() -> list[str]:
    """The cgroups this process's queues have made and not removed."""
    mine = f"procq-{os.getpid()}-"
    found = []
    for place in cgroups.usable().values():
        if isinstance(place, cgroups.Place):
            found += [os.path.join(place.parent, n) for n in os.listdir(place.parent) if n.startswith(mine)]
    return found


@pytest.fixture
def nothing_left() -> Iterator[None]:
    """Fails a test that leaves a cgroup behind once its queue is closed."""
    assert _ours() == []
    yield
    assert _ours() == []


def _lane(**kwargs: Any) -> Lane:
    lane_options = {k: kwargs.pop(k) for k in ("rlimits", "memory_limit") if k in kwargs}
    return Lane(workers=1, trusted=False, timeout=WAIT, sandbox=Sandbox(**kwargs), **lane_options)


def _serves(q: ProcQueue) -> None:
    assert q.push_and_wait(Job(f"next:{os.urandom(4).hex()}", js.square, args=(7,)), timeout=WAIT) == 49


@pytest.mark.parametrize("bound", [{"max_processes": 16}, {"rlimits": {"nproc": 16}}], ids=["max_processes", "nproc"])
def test_a_fork_bomb_makes_at_most_16_processes(bound: dict[str, Any], nothing_left: None) -> None:
    with open_queue({"s": _lane(**bound)}) as q:
        how = (q.stats().lanes["s"].sandbox or {})["max_processes"]
        assert how.endswith("at most 16 processes and threads"), how
        if os.geteuid() == 0:
            assert "pids cgroup" in how, how  # RLIMIT_NPROC does not bind root
        said = q.push_and_wait(Job("bomb", jb.fork_bomb), timeout=WAIT)
        assert 1 < said["processes"] <= 16 and said["refused"] >= 1, said
        _serves(q)
        again = q.push_and_wait(Job("bomb again", jb.fork_bomb), timeout=WAIT)
        assert again["processes"] == said["processes"], (said, again)  # the first bomb left nothing running


def _memory_cgroups() -> bool:
    """May this process make memory cgroups? (Root may; an ordinary user, where one is delegated to it.)
    Where it may not, a memory bound must be refused when the queue is made."""
    if isinstance(cgroups.usable()["memory"], cgroups.Place):
        return True
    with pytest.raises(SandboxUnavailable, match=r"the sandbox's max_memory bound cannot be enforced here") as caught:
        ProcQueue({"s": _lane(max_memory="48M")})
    assert caught.value.part == "max_memory"
    return False


def test_a_job_killed_at_its_timeout_leaves_no_cgroup_behind(nothing_left: None) -> None:
    memory = _memory_cgroups()
    with open_queue({"s": _lane(max_processes=16, max_memory="64M" if memory else None)}) as q:
        _serves(q)
        made = len(_ours())  # its worker's (here a pids and a memory cgroup, cgroup v1)
        assert made == len({p.parent for p in cgroups.usable().values() if isinstance(p, cgroups.Place)})
        with pytest.raises(JobFailed) as caught:
            q.push_and_wait(Job("hang", jb.spawn_and_hang, args=(8,), timeout=1), timeout=WAIT)
        assert caught.value.failure.kind == "timeout"
        _serves(q)  # by a new worker: the one killed was reaped, and its cgroups removed
        assert len(_ours()) == made


def _held(dirs: list[str]) -> list[str]:
    """A cgroup made below each of ``dirs``: the kernel refuses to remove a
    cgroup that has one (EBUSY) as it does one whose processes are still exiting."""
    held = [os.path.join(d, "held") for d in dirs]
    for path in held:
        os.mkdir(path)
    return held


def _pids_place() -> cgroups.Place | None:
    place = cgroups.usable()["pids"]
    return place if isinstance(place, cgroups.Place) else None


def test_a_busy_cgroup_is_removed_on_a_thread_of_its_own(nothing_left: None) -> None:
    place = _pids_place()
    if place is None:
        pytest.skip(f"this process may make no pids cgroup: {cgroups.usable()['pids']}")
    made = list(cgroups.make({"pids": place}, 16, None).values())
    held = _held(made)
    done = cgroups.remove_soon(made)
    # Handed over, not waited for: it cannot be removed while the one below it is there.
    assert not done.is_set() and all(os.path.isdir(d) for d in made)
    for path in held:
        os.rmdir(path)
    assert done.wait(WAIT)
    assert not any(os.path.exists(d) for d in made)


def test_a_dead_workers_busy_cgroup_holds_up_no_other_job(nothing_left: None) -> None:
    """The I/O thread reaps a worker killed at its job's timeout; its cgroup,
    still busy, is removed on the cgroups' thread while the queue serves on,
    and is gone once the queue is closed."""
    if _pids_place() is None:
        pytest.skip(f"this process may make no pids cgroup: {cgroups.usable()['pids']}")
    with open_queue({"s": _lane(max_processes=16)}) as q:
        _serves(q)
        first = _ours()
        held = _held(first)
        try:
            with pytest.raises(JobFailed) as caught:
                q.push_and_wait(Job("hang", jb.spawn_and_hang, args=(2,), timeout=1), timeout=WAIT)
            assert caught.value.failure.kind == "timeout"
            _serves(q)  # by its replacement, while the first worker's cgroup cannot be removed
            assert all(os.path.isdir(d) for d in first)
            assert not cgroups.settle(0)  # its removal is still under way
        finally:
            for path in held:
                os.rmdir(path)
    assert cgroups.settle(WAIT)


def test_without_a_process_bound_the_bomb_runs_its_course(nothing_left: None) -> None:
    with open_queue({"s": _lane(max_processes=None)}) as q:
        assert q.push_and_wait(Job("bomb", jb.fork_bomb), timeout=WAIT) == {"processes": 127, "refused": 0, "why": []}


def test_a_disk_filler_gets_enospc_at_max_tmp_and_leaves_nothing(nothing_left: None) -> None:
    with open_queue({"s": _lane(max_tmp="64M")}) as q:
        assert (q.stats().lanes["s"].sandbox or {})["max_tmp"].endswith(": 64 MiB each")
        said = q.push_and_wait(Job("fill", jb.fill_tmp, args=(300,)), timeout=WAIT)
        assert said["error"] == "ENOSPC" and 32 <= said["written"] <= 64, said
        assert q.push_and_wait(Job("gone", jb.tmp_exists, args=(said["tmp"],)), timeout=WAIT) is False
        refill = q.push_and_wait(Job("refill", jb.fill_tmp, args=(48,)), timeout=WAIT)
        assert refill["error"] is None and refill["written"] == 48, refill  # the space came back


def test_a_memory_hog_is_killed_as_memory_past_max_memory(nothing_left: None) -> None:
    if not _memory_cgroups():
        return
    with open_queue({"s": _lane(max_memory="48M")}) as q:
        how = (q.stats().lanes["s"].sandbox or {})["max_memory"]
        assert "memory cgroup" in how and "48 MiB" in how, how
        with pytest.raises(JobFailed) as caught:
            q.push_and_wait(Job("hog", jb.hog, args=(128,)), timeout=WAIT)
        failure = caught.value.failure
        assert failure.kind == "memory" and failure.signal == "SIGKILL", failure
        assert "went over its sandbox's max_memory" in failure.message
        _serves(q)
        assert q.push_and_wait(Job("small", jb.hog, args=(8,)), timeout=WAIT) == 8 << 20


def test_without_a_memory_bound_the_hog_gets_its_memory(nothing_left: None) -> None:
    with open_queue({"s": _lane()}) as q:
        assert (q.stats().lanes["s"].sandbox or {})["max_memory"].startswith("unbounded")
        assert q.push_and_wait(Job("hog", jb.hog, args=(128,)), timeout=WAIT) == 128 << 20


def test_the_lanes_memory_limit_is_the_default_max_memory(nothing_left: None) -> None:
    if not _memory_cgroups():
        return
    with open_queue({"s": _lane(memory_limit="96M")}) as q:
        assert "96 MiB, its temporary files included" in (q.stats().lanes["s"].sandbox or {})["max_memory"]
        _serves(q)


def test_a_lanes_memory_limit_kills_a_hog_as_memory_whoever_runs_the_supervisor(nothing_left: None) -> None:
    """A memory_limit binds a sandboxed lane as any untrusted one, cgroup or
    not (``nobody``'s side, without one, is test_sandbox_users'), and the lane
    serves on."""
    with open_queue({"s": _lane(memory_limit="64M")}) as q:
        how = (q.stats().lanes["s"].sandbox or {})["max_memory"]
        assert "64 MiB" in how, how
        with pytest.raises(JobFailed) as caught:
            q.push_and_wait(Job("hog", jb.hog, args=(256,)), timeout=WAIT)
        assert caught.value.failure.kind == "memory", caught.value.failure
        _serves(q)
        assert q.push_and_wait(Job("small", jb.hog, args=(8,)), timeout=WAIT) == 8 << 20


def test_temporary_files_count_against_max_memory(nothing_left: None) -> None:
    """The tmpfs pages a job writes are its memory: filling 64 MiB of tmp
    under a 48 MiB memory bound is stopped by the memory cgroup first."""
    if not _memory_cgroups():
        return
    with open_queue({"s": _lane(max_memory="48M", max_tmp="128M")}) as q:
        try:
            said = q.push_and_wait(Job("fill", jb.fill_tmp, args=(96,)), timeout=WAIT)
        except JobFailed as exc:
            assert exc.failure.kind == "memory", exc.failure
        else:
            assert said["error"] is not None and said["written"] < 48, said
        _serves(q)


_KILLED = """
import json, sys
sys.path[:0] = json.loads(sys.argv[1])
import jobs_sandbox as js
from procq import Job, Lane, ProcQueue, Sandbox
from procq._system import cgroups
q = ProcQueue({"s": Lane(workers=2, trusted=False, sandbox=Sandbox(max_processes=16))})
assert q.push_and_wait(Job("a", js.square, args=(3,)), timeout=20) == 9
print(json.dumps([p.parent for p in cgroups.usable().values() if isinstance(p, cgroups.Place)]), flush=True)
sys.stdin.read()  # until the test kills it
"""


def test_the_cgroups_of_a_killed_supervisor_are_removed_by_the_next_process(nothing_left: None) -> None:
    if not isinstance(cgroups.usable()["pids"], cgroups.Place):
        return  # no cgroup to leave: RLIMIT_NPROC holds the bomb (test_a_fork_bomb_makes_at_most_16_processes)
    here = Path(__file__).parent
    path = json.dumps([str(here), str(here.parent)])
    with subprocess.Popen([sys.executable, "-c", _KILLED, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True, start_new_session=True) as killed:  # fmt: skip
        assert killed.stdout is not None
        parents = json.loads(killed.stdout.readline())
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(timeout=WAIT)
    prefix = f"procq-{killed.pid}-"
    left = [os.path.join(p, n) for p in parents for n in os.listdir(p) if n.startswith(prefix)]
    assert left, "the killed supervisor left no cgroup: nothing to remove"
    # Any procq process that asks where it may make cgroups removes those whose supervisor is gone.
    code = (
        "import sys, json; sys.path[:0] = json.loads(sys.argv[1]); from procq._system import cgroups; cgroups.usable()"
    )
    subprocess.run([sys.executable, "-c", code, json.dumps([str(here.parent)])], check=True, timeout=WAIT)
    assert [p for p in left if os.path.exists(p)] == []


def test_a_memory_kill_is_one_exit_message_the_worker_may_send() -> None:
    assert decode_untrusted(b'["exit", 3, -9, "memory"]') == JobExit(3, -9, True)
    assert decode_untrusted(b'["exit", 3, -9]') == JobExit(3, -9, False)
    for other in (b'["exit", 3, -9, "cpu"]', b'["exit", 3, -9, true]', b'["exit", 3, -9, "memory", 1]'):
        with pytest.raises(ProtocolError):
            decode_untrusted(other)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"max_processes": 0}, ValueError, "Sandbox max_processes must be at least 1"),
        ({"max_processes": "16"}, TypeError, "Sandbox max_processes must be an int or None, got str"),
        ({"max_processes": True}, TypeError, "Sandbox max_processes must be an int or None, got bool"),
        ({"max_memory": "lots"}, ValueError, "Sandbox max_memory must be a number of bytes"),
        ({"max_tmp": 0}, ValueError, "Sandbox max_tmp must be at least 1 byte"),
        ({"relax": ("max_disk",)}, ValueError, "the bounds are max_processes, max_memory, max_tmp"),
    ],
)
def test_bad_bounds_are_refused_when_made(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Sandbox(**kwargs)


def test_bounds_are_held_as_numbers() -> None:
    s = Sandbox(max_memory="64M", max_tmp="1G", relax=("max_tmp", "files"))
    assert (s.max_processes, s.max_memory, s.max_tmp) == (256, 64 << 20, 1 << 30)
    assert s.relax == ("files", "max_tmp")
    assert Sandbox().max_tmp == 256 << 20 and Sandbox().max_memory is None
    _ = SandboxUnavailable
