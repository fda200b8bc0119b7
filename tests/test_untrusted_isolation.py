"""What a job in an untrusted lane can reach: not the supervisor's memory,
environment or descriptors, nor a trusted worker's, nor the supervisor's
belief that it is alive; and what its result may cost the supervisor."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import jobs
import jobs_hardening as hj
import pytest
from core_support import failure_of, open_queue

from procq import Job, Lane

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="untrusted lanes' isolation is Linux's")

PROBE = str(Path(__file__).with_name("untrusted_probe.py"))
_PR_CAPBSET_DROP = 24


def _drop_every_capability() -> None:
    """(In the child, before exec) empty the capability bounding set, so the
    program it execs runs as uid 0 with no capability at all: to the kernel's
    checks on tracing, ``/proc`` and descriptors, an ordinary user."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)


def _run_probe(unprivileged: bool) -> dict[str, Any]:
    preexec = _drop_every_capability if unprivileged and os.getuid() == 0 else None
    with subprocess.Popen(
        [sys.executable, PROBE],
        cwd="/",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec,
        start_new_session=True,
    ) as probe:
        try:
            out, err = probe.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(probe.pid, signal.SIGKILL)  # the probe leads its own group: it and its workers
            out, err = probe.communicate(timeout=10)
            pytest.fail(f"the probe did not finish within 40 s: {err[-3000:]}")
    assert probe.returncode == 0, err[-3000:]
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("unprivileged", [False, True], ids=["as-root-or-this-user", "no-capabilities"])
def test_an_untrusted_job_cannot_reach_the_supervisor_or_a_trusted_worker(unprivileged: bool) -> None:
    result = _run_probe(unprivileged)
    report = result["report"]
    assert isinstance(report, dict), report
    # Names of the descriptors in /proc/<pid>/fd are visible to uid 0 with no
    # capability: the directory of a non-dumpable process belongs to root, and
    # the kernel checks only ownership to list it. What matters, opening them
    # ("fd open") or taking them ("pidfd_getfd"), is checked here as for anyone.
    ignored = {"uid"} | ({p for p in report if p.endswith("fd list")} if report["uid"] == "0" else set())
    reached = {probe: what for probe, what in report.items() if probe not in ignored and not what.startswith("denied")}
    assert not reached, f"an untrusted job reached: {reached}"
    probed = {"forkserver fork", "forkserver ptrace", "own worker ptrace", "trusted worker fd open"}
    assert probed <= report.keys(), report


@pytest.mark.parametrize("unprivileged", [False, True], ids=["as-root-or-this-user", "no-capabilities"])
def test_a_byte_in_the_alive_pipe_does_not_poison_later_jobs(unprivileged: bool) -> None:
    result = _run_probe(unprivileged)
    assert not str(result["poisoned"]).startswith("failed"), result["poisoned"]
    assert result["after"] == [0, 1, 4], result["after"]


@pytest.fixture
def sandbox() -> Any:
    with open_queue({"sandbox": Lane(workers=1, trusted=False)}) as q:
        yield q


@pytest.mark.parametrize("fn", [hj.int_keys, hj.nested_keys], ids=["top-level", "nested"])
def test_a_dict_with_non_str_keys_fails_the_job(sandbox: Any, fn: Any) -> None:
    handle = sandbox.push(Job(f"keys:{fn.__name__}", fn)).handle
    failure = failure_of(handle, "error")
    assert "str" in failure.message and "key" in failure.message
    assert sandbox.push_and_wait(Job("after", jobs.square, args=(3,))) == 9


def test_cpu_exhaustion_is_a_timeout_even_when_the_job_ignores_sigxcpu() -> None:
    with open_queue({"sandbox": Lane(workers=1, trusted=False, rlimits={"cpu": 1})}) as q:
        handle = q.push(Job("spin", hj.spin_ignoring_sigxcpu, args=(30.0,))).handle
        failure = failure_of(handle, "timeout", timeout=60)
        assert "cpu" in failure.message.lower()
        assert q.push_and_wait(Job("after", jobs.square, args=(4,))) == 16


def test_an_untrusted_job_cannot_raise_its_cpu_limit() -> None:
    with open_queue({"sandbox": Lane(workers=1, trusted=False, rlimits={"cpu": 5})}) as q:
        said = q.push_and_wait(Job("raise-limit", hj.raise_cpu_limit))
        assert said.startswith("refused"), said


def test_a_result_that_would_decode_to_too_many_values_is_refused(sandbox: Any) -> None:
    # About 3 MB of JSON text, well under max_result_bytes, that would decode
    # into over a million lists.
    handle = sandbox.push(Job("amplified", hj.amplified, args=(1_100_000,))).handle
    failure = failure_of(handle, "protocol", timeout=60)
    assert "values" in failure.message
    assert sandbox.push_and_wait(Job("after", jobs.square, args=(5,))) == 25


def test_a_result_with_many_values_under_the_bound_comes_back(sandbox: Any) -> None:
    assert sandbox.push_and_wait(Job("many", hj.amplified, args=(200_000,)), timeout=60) == [[]] * 200_000
