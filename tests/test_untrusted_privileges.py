"""What an untrusted job's process holds and may do (no capability, no way to
gain one, a hard CPU limit, results that come back as they were returned), and
what a queue with an untrusted lane changes for the supervisor's process and
its trusted workers (not dumpable) and for a trusted worker's watch on its
supervisor (only EOF is a death)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jobs
import jobs_hardening as hj
import jobs_hostile
import pytest
from core_support import WAIT, failure_of, open_queue

from procq import Job, Lane
from procq._system.privileges import landlock_abi

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="these are Linux's")


@pytest.fixture
def sandbox() -> Any:
    with open_queue({"sandbox": Lane(workers=1, trusted=False)}) as q:
        yield q


# --- results -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "key", "where"),
    [
        ("bool", "True (bool)", "result"),
        ("float", "1.5 (float)", "result['a']"),
        ("none", "None (NoneType)", "result[0]"),
        ("tuple", "(1, 2) (tuple)", "result"),
        ("in tuple", "3 (int)", "result[1][0]['fine'][1]"),
        ("deep", "7 (int)", ""),  # too deep to spell out where
    ],
)
def test_every_kind_of_non_str_key_at_any_depth_fails_the_job(sandbox: Any, kind: str, key: str, where: str) -> None:
    failure = failure_of(sandbox.push(Job(f"keys:{kind}", hj.result_of_kind, args=(kind,))).handle, "error")
    assert failure.exc_type == "NonStrKey"
    assert f"has the key {key}: an untrusted lane's results travel as JSON" in failure.message, failure.message
    assert "every dict key in them must be a str" in failure.message
    if where:
        assert failure.message.startswith(f"NonStrKey: {where} has the key"), failure.message
    assert sandbox.push_and_wait(Job("after", jobs.square, args=(3,)), timeout=WAIT) == 9


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("str subclass", {"k": [1, 2]}), ("deep and fine", hj._deep({"k": "v"}, 500))],
)
def test_str_keys_come_back_as_they_were(sandbox: Any, kind: str, expected: Any) -> None:
    assert sandbox.push_and_wait(Job(f"keys:{kind}", hj.result_of_kind, args=(kind,)), timeout=WAIT) == expected


def test_a_cyclic_result_fails_the_job_and_does_not_hang_the_key_check(sandbox: Any) -> None:
    failure = failure_of(sandbox.push(Job("cyclic", hj.result_of_kind, args=("cyclic",))).handle, "error")
    assert "Circular reference" in failure.message, failure.message


# --- the job's process -------------------------------------------------------------------


def test_an_untrusted_job_has_no_capability_and_cannot_gain_one(sandbox: Any) -> None:
    held = sandbox.push_and_wait(Job("privileges", hj.privileges), timeout=WAIT)
    assert held["caps"] == {"CapInh": 0, "CapPrm": 0, "CapEff": 0, "CapBnd": 0, "CapAmb": 0} or (
        # An unprivileged user keeps the usual bounding set: with no_new_privs
        # no exec can raise its capabilities into it.
        held["uid"] != 0 and held["caps"]["CapPrm"] == held["caps"]["CapEff"] == 0
    ), held
    assert held["no_new_privs"] == 1
    assert held["dumpable"] == 0


@pytest.mark.skipif(landlock_abi() < 6, reason="Landlock scopes signals from ABI 6 (Linux 6.12)")
def test_an_untrusted_job_cannot_signal_processes_outside_its_own_tree() -> None:
    with open_queue({"trusted": Lane(workers=1), "sandbox": Lane(workers=1, trusted=False)}) as q:
        trusted = q.push_and_wait(Job("pid", jobs.getpid, lane="trusted"), timeout=WAIT)
        said = q.push_and_wait(
            Job("signals", hj.signals, args=({"supervisor": os.getpid(), "trusted worker": trusted},), lane="sandbox"),
            timeout=WAIT,
        )
    assert said["own child"] == "allowed", said
    assert {name: what for name, what in said.items() if name != "own child" and what == "allowed"} == {}, said


@pytest.mark.parametrize("fn", [hj.spin, hj.handle_sigxcpu_and_spin, hj.spin_ignoring_sigxcpu])
def test_cpu_exhaustion_is_a_timeout_whatever_the_job_does_with_sigxcpu(fn: Any) -> None:
    with open_queue({"sandbox": Lane(workers=1, trusted=False, rlimits={"cpu": 1})}) as q:
        pid = q.push_and_wait(Job("pid", jobs.worker_pid), timeout=WAIT)
        failure = failure_of(q.push(Job("spin", fn, args=(30.0,))).handle, "timeout", timeout=60)
        assert (failure.signal, failure.exitcode) == ("SIGXCPU", -24)
        assert "CPU-time limit" in failure.message
        # Under the limit, a job completes; the worker was never replaced.
        assert q.push_and_wait(Job("short", fn, args=(0.2,)), timeout=WAIT) == "spun"
        assert q.push_and_wait(Job("pid-again", jobs.worker_pid), timeout=WAIT) == pid


def test_a_job_killed_with_sigkill_under_its_cpu_limit_is_a_crash() -> None:
    with open_queue({"sandbox": Lane(workers=1, trusted=False, rlimits={"cpu": 30})}) as q:
        pid = q.push_and_wait(Job("pid", jobs.worker_pid), timeout=WAIT)
        failure = failure_of(q.push(Job("killed", jobs_hostile.signal_self, args=(9,))).handle, "crashed")
        assert failure.signal == "SIGKILL" and failure.pid == pid


# --- the supervisor's process and its trusted workers ----------------------------------------

_DUMPABILITY = """
import json, sys
sys.path[:0] = {path!r}
import jobs, jobs_hardening
from procq import Job, Lane, ProcQueue
if __name__ == "__main__":
    with ProcQueue({lanes}, start_method={method!r}) as q:
        worker = q.push_and_wait(Job("d", jobs_hardening.dumpable, lane="trusted"), timeout=60)
        print(json.dumps({{"supervisor": jobs_hardening.dumpable(), "trusted worker": worker}}))
"""


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
@pytest.mark.parametrize("untrusted", [False, True], ids=["trusted-only", "with-untrusted-lane"])
def test_a_queue_with_an_untrusted_lane_makes_its_process_and_trusted_workers_untraceable(
    tmp_path: Path, method: str, untrusted: bool
) -> None:
    """Run in a fresh process: being untraceable is process-wide and never undone."""
    lanes = '{"trusted": 1, "sandbox": Lane(workers=1, trusted=False)}' if untrusted else '{"trusted": 1}'
    here = str(Path(__file__).parent)
    code = _DUMPABILITY.format(path=[here, *sys.path], lanes=lanes, method=method)
    script = tmp_path / "dumpability.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    # Without untrusted lanes, as before: a native crash can leave a core dump.
    expected = 0 if untrusted else 1
    assert said == {"supervisor": expected, "trusted worker": expected}, said


def test_a_byte_written_into_a_trusted_workers_parent_sentinel_does_not_end_it() -> None:
    with open_queue({"trusted": Lane(workers=1)}) as q:
        pid = q.push_and_wait(Job("pid", jobs.getpid), timeout=WAIT)
        assert q.push_and_wait(Job("poke", hj.poke_parent_sentinel, args=(os.getpid(),)), timeout=WAIT) == 1
        assert q.push_and_wait(Job("pid-again", jobs.getpid), timeout=WAIT) == pid
        assert q.stats().lanes["trusted"].worker_restarts == 0
