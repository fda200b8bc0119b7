"""Untrusted lanes (``Lane(trusted=False)``) against hostile jobs.

An untrusted lane's job runs in a process its worker forks for it, and writes
its answer on a socket the worker relays to the supervisor. The hostile table
(in the manner of test_crashes' crash table): each row is a job that writes
something raw to that socket, and the failure that must result. Whatever the
row, only that job fails, nothing the worker sent is unpickled, the worker is
replaced (unless the job's process merely exited without an answer), a job
running in the lane's other worker finishes with its own output, and the lane
keeps working.

Then: a job that writes half a frame and hangs; one that claims to report on a
job another worker runs; one that answers early and waits for the next job;
what a job's process holds; crashes that keep the worker; kill semantics;
resource limits (per job, hard) against a fork bomb, a huge file, many
descriptors and a CPU spin; and honest jobs whose results or exceptions must
come back as data.

Untrusted workers are started with ``subprocess``, not by the queue's start
method, so these tests run once, under the default start method.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import signal
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jobs
import jobs_control
import jobs_hostile
import pytest
from core_support import (
    WAIT,
    Gates,
    assert_all_gone,
    failure_of,
    hold,
    open_queue,
    wait_started,
)
from process_support import linux_only, subreaper

from procq import Completed, Failed, Job, JobFailed, Lane, Processing, ProcQueue, Queued
from procq._model.errors import _RemoteTraceback

pytestmark = pytest.mark.skipif(not linux_only, reason="untrusted lanes need Linux (pidfd_open, /proc)")

LIMIT = 8192  # the hostile lane's max_result_bytes
SLACK = 1 << 20  # what an untrusted message may take beyond it (procq's MESSAGE_SLACK)
UNTRUSTED = "u"


@pytest.fixture
def q() -> Iterator[ProcQueue]:
    """An untrusted lane of two workers, and a trusted lane."""
    with open_queue({UNTRUSTED: Lane(workers=2, trusted=False, max_result_bytes=LIMIT), "t": 1}) as queue:
        yield queue


# --- The table ----------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A hostile job and the failure it must end in. ``message`` is a regular
    expression for what follows "broke procq's protocol with " (kind
    "protocol") or for the whole message (other kinds); ``<id>`` stands for
    the id the job forged (see ``jobs_hostile.forge``)."""

    id: str
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kind: str = "protocol"
    message: str = ""
    # How the worker ended: a protocol breaker is SIGKILLed by the supervisor.
    exitcode: int | None = -9
    signal: str | None = "SIGKILL"
    crashed: bool = False
    # Whether the worker is replaced (a protocol breaker's always is).
    replaced: bool = True


def _raw_args(data: bytes) -> tuple[Any, ...]:
    return (data,)


def _forge_args(message: list[Any], delta: int = 0) -> tuple[Any, ...]:
    return (message, delta)


_NOT_JSON = r"a message that is not JSON \((JSONDecodeError|UnicodeDecodeError|RecursionError|ValueError): .*\)"
_LENGTH = r"a message of {} bytes, more than the lane's max_result_bytes of " + str(LIMIT) + " allows"

CASES = [
    # The body of this frame is replaced by a crafted pickle in the test (it needs tmp_path).
    Case("crafted-pickle", jobs_hostile.write_then_block, message=_NOT_JSON),
    Case("empty-frame", jobs_hostile.write_then_block, _raw_args(jobs_hostile.frame(b"")), message=_NOT_JSON),
    Case(
        "huge-int-literal",
        jobs_hostile.write_then_block,
        _raw_args(jobs_hostile.frame(b'["ok", 1, ' + b"7" * 100_000 + b"]")),
        message=_NOT_JSON,
    ),
    Case(
        "garbage-bytes",
        jobs_hostile.write_then_block,
        _raw_args(jobs_hostile.frame(b"\x00\xff garbage \x80")),
        message=_NOT_JSON,
    ),
    Case(
        "not-utf8",
        jobs_hostile.write_then_block,
        _raw_args(jobs_hostile.frame(b'["ok", 1, "\xff"]')),
        message=_NOT_JSON,
    ),
    Case(
        "unterminated-nesting",
        jobs_hostile.write_then_block,
        _raw_args(jobs_hostile.frame(b"[" * 100_000)),
        message=_NOT_JSON,
    ),
    Case(
        "deep-nesting",
        jobs_hostile.write_then_block,
        _raw_args(jobs_hostile.frame(b"[" * 50_000 + b"]" * 50_000)),
        message=_NOT_JSON,
    ),
    Case(
        "not-an-array",
        jobs_hostile.write_then_block,
        _raw_args(jobs_hostile.frame(b'{"ok": 1}')),
        message=re.escape("a message that is not a tagged JSON array: b'{\"ok\": 1}'"),
    ),
    Case(
        "no-job-id",
        jobs_hostile.write_then_block,
        _raw_args(jobs_hostile.frame(b'["ok"]')),
        message=re.escape("a message without a job id: b'[\"ok\"]'"),
    ),
    Case(
        "job-id-not-an-int",
        jobs_hostile.write_then_block,
        _raw_args(jobs_hostile.frame(b'["ok", true, 1]')),
        message=re.escape("a message without a job id: b'[\"ok\", true, 1]'"),
    ),
    Case(
        "ok-without-output",
        jobs_hostile.forge,
        _forge_args(["ok", "<id>"]),
        message=r"a malformed message: b'\[\"ok\", <id>\]'",
    ),
    Case(
        "error-with-unknown-kind",
        jobs_hostile.forge,
        _forge_args(["error", "<id>", "sandbox-escape", "X", "m", "tb"]),
        message=re.escape("an error message with an unknown kind 'sandbox-escape'"),
    ),
    Case(
        "error-with-non-text-fields",
        jobs_hostile.forge,
        _forge_args(["error", "<id>", "error", "X", {"m": 1}, "tb"]),
        message=r"a malformed message: b'\[\"error\", <id>, .*",
    ),
    Case(
        "huge-length-prefix",
        jobs_hostile.write_then_block,
        _raw_args(struct.pack("!i", 2**31 - 1)),
        message=_LENGTH.format(2**31 - 1),
    ),
    Case(
        "huge-8-byte-length-prefix",
        jobs_hostile.write_then_block,
        _raw_args(struct.pack("!i", -1) + struct.pack("!Q", 2**40)),
        message=_LENGTH.format(2**40),
    ),
    Case(
        "length-just-past-the-limit",
        jobs_hostile.write_then_block,
        _raw_args(struct.pack("!i", LIMIT + SLACK + 1)),
        message=_LENGTH.format(LIMIT + SLACK + 1),
    ),
    Case(
        "negative-length",
        jobs_hostile.write_then_block,
        _raw_args(struct.pack("!i", -7)),
        message=re.escape("a message with a negative length (-7)"),
    ),
    Case(
        "oversized-ok-frame",
        jobs_hostile.forge,
        _forge_args(["ok", "<id>", "x" * (2 * LIMIT)]),
        message=rf"a result of \d+ bytes, more than the lane's max_result_bytes of {LIMIT}",
    ),
    Case(
        "another-jobs-id",
        jobs_hostile.forge,
        _forge_args(["ok", "<id>", "forged"], delta=1000),
        message=r"a message about job id <id> while it held job 'row:another-jobs-id'",
    ),
    Case(
        "second-ready",
        jobs_hostile.write_then_block,
        _raw_args(jobs_hostile.frame(b'["ready"]')),
        message="a READY message written by the job",
    ),
    Case(
        "exit-message",
        jobs_hostile.forge,
        _forge_args(["exit", "<id>", 0]),
        message="an exit message written by the job",
    ),
    Case(
        "memory-exit-message",
        jobs_hostile.forge,
        _forge_args(["exit", "<id>", -9, "memory"]),
        message="an exit message written by the job",
    ),
    Case(
        "answer-then-exit-message",
        jobs_hostile.forge_two,
        (["ok", "<id>", "forged"], ["exit", "<id>", 0]),
        message="an exit message written by the job",
    ),
    Case(
        "two-answers",
        jobs_hostile.forge_two,
        (["ok", "<id>", "one"], ["ok", "<id>", "two"]),
        message="a second answer for job 'row:two-answers'",
    ),
    # The job's process ends without an answer: the worker reports its exit, and stays.
    Case(
        "close-pipe-then-exit-0",
        jobs_hostile.close_pipe_then_exit,
        kind="crashed",
        exitcode=0,
        signal=None,
        crashed=True,
        replaced=False,
        message=r"the process running job 'row:close-pipe-then-exit-0' \(forked by worker <pid> of lane 'u'\) "
        r"exited with code 0 \(os\._exit\(\), or exit\(\) in native code, ended it mid-job\)",
    ),
    Case(
        "half-a-frame-then-exit-0",
        jobs_hostile.write_then_exit,
        _raw_args(struct.pack("!i", 100) + b'["ok"'),
        message=re.escape("a message cut short (the job's process ended partway through writing it)"),
    ),
    Case(
        "half-a-length-then-exit-0",
        jobs_hostile.write_then_exit,
        _raw_args(b"\x00\x00"),
        message=re.escape("a message cut short (the job's process ended partway through writing it)"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_table(q: ProcQueue, tmp_path: Any, gates: Gates, case: Case) -> None:
    key = f"row:{case.id}"
    args = case.args
    marker = str(tmp_path / "pwned")
    if case.id == "crafted-pickle":
        # The payload really does run code when unpickled: here, in the test.
        control = str(tmp_path / "control")
        pickle.loads(jobs_hostile.crafted_pickle(control))
        assert os.path.isdir(control)
        args = (jobs_hostile.frame(jobs_hostile.crafted_pickle(marker)),)
    report = str(tmp_path / "forged-id")
    if case.fn in (jobs_hostile.forge, jobs_hostile.forge_two):
        args = (*args, report)
    pids = set(q._worker_pids())
    # A job on the lane's other worker, running throughout.
    bystander, bystander_pid, go = hold(q, gates, "bystander", lane=UNTRUSTED)
    before = q.stats()

    handle = q.push(Job(key, case.fn, args, lane=UNTRUSTED)).handle
    failure = failure_of(handle, case.kind)
    pid = failure.pid
    assert pid in pids and pid != bystander_pid
    expected = case.message.replace("<pid>", str(pid))
    if os.path.exists(report):
        expected = expected.replace("<id>", Path(report).read_text())
    if case.kind == "protocol":
        expected = (
            rf"the worker \(pid {pid}, lane 'u'\) running job '{key}' broke procq's protocol with {expected}; "
            r"the job failed and the worker was replaced"
        )
    assert re.fullmatch(expected, failure.message, re.DOTALL), failure.message
    assert (failure.exitcode, failure.signal) == (case.exitcode, case.signal)
    assert (failure.exc_type, failure.traceback, failure.exception) == (None, None, None)
    assert not os.path.exists(marker), "the supervisor ran code from the worker's pipe"
    assert q.state(key) == Failed(failure)

    # Only this job failed; its worker was replaced (if it must be); the bystander never noticed.
    after = q.stats()
    assert after.failed == before.failed + 1
    lane = after.lanes[UNTRUSTED]
    assert (lane.failed, lane.crashes) == (
        before.lanes[UNTRUSTED].failed + 1,
        before.lanes[UNTRUSTED].crashes + case.crashed,
    )
    assert lane.worker_restarts == before.lanes[UNTRUSTED].worker_restarts + case.replaced
    assert (pid in q._worker_pids()) is not case.replaced
    assert q.state("bystander") == Processing()
    go.open()
    assert bystander.result(timeout=WAIT) == bystander_pid
    _assert_lane_works(q, excluded=frozenset({pid}) if case.replaced else frozenset())
    assert after.lanes["t"] == before.lanes["t"]


def _assert_lane_works(q: ProcQueue, excluded: frozenset[int] = frozenset()) -> None:
    """Normal jobs complete on the untrusted lane (two at once) and on the trusted one."""
    handles = [q.push(Job(f"after:{i}", jobs.worker_pid, lane=UNTRUSTED)).handle for i in range(4)]
    pids = {h.result(timeout=WAIT) for h in handles}
    assert pids <= set(q._worker_pids()) and not pids & excluded
    assert q.push_and_wait(Job("after:t", jobs.square, args=(7,), lane="t"), timeout=WAIT) == 49
    lane = q.stats().lanes[UNTRUSTED]
    assert (lane.workers_alive, lane.running, lane.waiting) == (2, 0, 0)
    q._check_invariants()


# --- Around the table ---------------------------------------------------------------------


def test_half_a_frame_then_a_hang_blocks_nothing(q: ProcQueue, tmp_path: Any) -> None:
    """A worker writes part of a frame and stops. The supervisor never waits
    for the rest: every other job, in this lane and the other, keeps
    completing, and the hanging job ends by its own timeout."""
    started = jobs.fifo(tmp_path, "started")
    partial = struct.pack("!i", 1000) + b'["ok", 1, "'
    handle = q.push(
        Job("half", jobs_hostile.write_then_block, args=(partial, started), lane=UNTRUSTED, timeout=2)
    ).handle
    assert wait_started(handle, started) == b"1"  # the half frame is written
    for i in range(3):
        assert q.push_and_wait(Job(f"u{i}", jobs.square, args=(i,), lane=UNTRUSTED), timeout=WAIT) == i * i
        assert q.push_and_wait(Job(f"t{i}", jobs.square, args=(i,), lane="t"), timeout=WAIT) == i * i
    failure = failure_of(handle, "timeout")
    assert failure.message.startswith("job 'half' ran longer than its timeout of 2s; its worker (pid ")
    _assert_lane_works(q, excluded=frozenset({failure.pid}))


@pytest.mark.parametrize("tag", ["ok", "error"])
def test_a_message_about_a_job_another_worker_runs(q: ProcQueue, tmp_path: Any, gates: Gates, tag: str) -> None:
    """A worker reports on the job the lane's other worker is running: the
    liar's job fails, the other job runs on and ends with its own output."""
    victim, victim_pid, go = hold(q, gates, "victim", lane=UNTRUSTED)
    victim_id = victim._entry.job_id  # (private: the id the forger must guess)
    report = str(tmp_path / "forged-id")
    message = ["ok", "<id>", "forged"] if tag == "ok" else ["error", "<id>", "error", "ValueError", "forged", "tb"]
    # Ids are handed out in push order: the victim's is the forger's less one.
    liar = q.push(Job("liar", jobs_hostile.forge, args=(message, -1, report), lane=UNTRUSTED)).handle
    failure = failure_of(liar, "protocol")
    assert int(Path(report).read_text()) == victim_id
    assert (
        f"broke procq's protocol with a message about job id {victim_id} while it held job 'liar';" in failure.message
    )
    assert q.state("victim") == Processing()
    go.open()
    assert victim.result(timeout=WAIT) == victim_pid
    _assert_lane_works(q, excluded=frozenset({failure.pid}))


def test_a_hostile_job_cannot_answer_for_the_next_job(tmp_path: Any) -> None:
    """A job that answers for itself early and then waits on its channel for
    the next job's frame finds only EOF: the supervisor's pipe is the
    worker's, and the next job runs in a process of its own."""
    report = str(tmp_path / "report")
    with open_queue({UNTRUSTED: Lane(workers=1, trusted=False)}) as q:
        pid = q.push_and_wait(Job("pid", jobs.worker_pid, lane=UNTRUSTED), timeout=WAIT)
        liar = Job("liar", jobs_hostile.answer_for_the_next_job, args=("pwned", report), lane=UNTRUSTED)
        assert q.push_and_wait(liar, timeout=WAIT) == "done"
        assert Path(report).read_text() == "no next job"
        assert q.push_and_wait(Job("victim", jobs.square, args=(3,), lane=UNTRUSTED, timeout=5), timeout=WAIT) == 9
        assert q.push_and_wait(Job("pid-again", jobs.worker_pid, lane=UNTRUSTED), timeout=WAIT) == pid
        assert q.stats().lanes[UNTRUSTED].worker_restarts == 0


def test_one_job_per_worker_keeps_a_hostile_job_from_the_next(tmp_path: Any) -> None:
    """With ``max_jobs_per_worker=1`` the next job goes to a fresh worker, too."""
    report = str(tmp_path / "report")
    with open_queue({UNTRUSTED: Lane(workers=1, trusted=False, max_jobs_per_worker=1)}) as q:
        liar = Job("liar", jobs_hostile.answer_for_the_next_job, args=("pwned", report), lane=UNTRUSTED)
        assert q.push_and_wait(liar, timeout=WAIT) == "done"
        assert q.push_and_wait(Job("victim", jobs.square, args=(3,), lane=UNTRUSTED), timeout=WAIT) == 9
        assert q.stats().lanes[UNTRUSTED].worker_restarts == 2


def test_a_jobs_process_holds_no_socket_but_its_own_channel(q: ProcQueue) -> None:
    """The job runs in a process its worker forked for it: its only socket is
    its channel to that worker, not the worker's pipe to the supervisor, and
    it holds nothing else but the standard streams."""
    seen = q.push_and_wait(Job("fds", jobs_hostile.channel_peers, lane=UNTRUSTED), timeout=WAIT)
    worker = seen["ppid"]
    assert worker in q._worker_pids() and seen["pid"] != worker
    fds = {int(fd): link for fd, link in seen["fds"].items()}
    extra = {fd: link for fd, link in fds.items() if fd > 2}
    assert [link.split(":")[0] for link in extra.values()] == ["socket"], fds
    # The socket was made by the worker (the pipe to the supervisor was made by this process).
    assert seen["peers"] == [worker], seen


def test_a_job_that_closes_its_channel_and_runs_on_ends_by_its_timeout(q: ProcQueue) -> None:
    """Closing its channel ends nothing: the job's process runs on, as any
    job may, until its timeout kills it and its worker."""
    handle = q.push(Job("hang", jobs_hostile.close_pipe_then_block, lane=UNTRUSTED, timeout=1)).handle
    failure = failure_of(handle, "timeout")
    assert failure.message.startswith("job 'hang' ran longer than its timeout of 1s; its worker (pid ")
    assert failure.pid not in q._worker_pids()
    _assert_lane_works(q, excluded=frozenset({failure.pid}))


def test_a_process_left_holding_the_channel_does_not_hold_the_job(tmp_path: Any) -> None:
    """The job's result counts once its own process has exited, even while a
    process it started keeps its channel open."""
    started = jobs.fifo(tmp_path, "started")
    with subreaper(), open_queue({UNTRUSTED: Lane(workers=1, trusted=False)}) as q:
        pid = q.push_and_wait(Job("pid", jobs.worker_pid, lane=UNTRUSTED), timeout=WAIT)
        handle = q.push(Job("holder", jobs_hostile.leave_a_holder, args=(started,), lane=UNTRUSTED)).handle
        jobs.wait_signal(started)
        holder = handle.result(timeout=WAIT)
        assert q.push_and_wait(Job("next", jobs.worker_pid, lane=UNTRUSTED), timeout=WAIT) == pid
    assert_all_gone([holder])


@pytest.mark.parametrize(
    ("fn", "args", "exitcode", "sig", "how"),
    [
        (
            jobs.exit_now,
            (3,),
            3,
            None,
            r"exited with code 3 \(os\._exit\(\), or exit\(\) in native code, ended it mid-job\)",
        ),
        (
            jobs.segfault,
            (),
            -11,
            "SIGSEGV",
            r"was killed by SIGSEGV \(signal 11\): a segmentation fault: native code run by the job crashed",
        ),
        (jobs_hostile.signal_self, (11,), -11, "SIGSEGV", r"was killed by SIGSEGV \(signal 11\): .*"),
        (jobs.sigkill_self, (), -9, "SIGKILL", r"was killed by SIGKILL \(signal 9\): .*"),
    ],
    ids=["exit-3", "segfault", "kill-sigsegv", "sigkill"],
)
def test_a_crashing_job_fails_alone_and_its_worker_stays(
    q: ProcQueue, fn: Any, args: Any, exitcode: int, sig: str | None, how: str
) -> None:
    pid = q.push_and_wait(Job("pid", jobs.worker_pid, lane=UNTRUSTED), timeout=WAIT)
    before = q.stats().lanes[UNTRUSTED]
    failure = failure_of(q.push(Job("crash", fn, args, lane=UNTRUSTED)).handle, "crashed")
    assert (failure.exitcode, failure.signal, failure.pid) == (exitcode, sig, pid)
    assert re.fullmatch(
        rf"the process running job 'crash' \(forked by worker {pid} of lane 'u'\) {how}", failure.message
    ), failure.message
    assert q.push_and_wait(Job("pid-again", jobs.worker_pid, lane=UNTRUSTED), timeout=WAIT) == pid
    lane = q.stats().lanes[UNTRUSTED]
    assert (lane.crashes, lane.failed, lane.worker_restarts) == (
        before.crashes + 1,
        before.failed + 1,
        before.worker_restarts,
    )
    _assert_lane_works(q)


def test_a_cancelled_job_handles_sigterm_before_its_worker_dies(tmp_path: Any) -> None:
    """Kill semantics are those of every lane: SIGTERM to the worker's process
    group, which holds the job's process; the worker waits for that process
    (its handler runs), then dies of SIGTERM itself and is replaced."""
    cleaned = str(tmp_path / "cleaned")
    started = jobs.fifo(tmp_path, "started")
    with open_queue({UNTRUSTED: Lane(trusted=False, kill_grace=30)}) as q:
        worker = q.push_and_wait(Job("pid", jobs.worker_pid, lane=UNTRUSTED), timeout=WAIT)
        handle = q.push(
            Job("tidy", jobs_control.handle_sigterm_then_block, args=(started, cleaned), lane=UNTRUSTED)
        ).handle
        job_pid = int(wait_started(handle, started))
        assert q.cancel("tidy") is True
        failure = failure_of(handle, "cancelled")
        assert (failure.pid, failure.signal, failure.exitcode) == (worker, "SIGTERM", -signal.SIGTERM)
        assert Path(cleaned).read_text() == f"cleaned up {job_pid}"
        assert worker not in q._worker_pids()
        assert q.push_and_wait(Job("after", jobs.square, args=(6,), lane=UNTRUSTED), timeout=WAIT) == 36


@pytest.mark.parametrize("how", ["timeout", "cancel"])
def test_no_descendant_of_a_killed_job_survives(tmp_path: Any, how: str) -> None:
    """The job's process, a child of it in the worker's process group and one
    in a session of its own all go with a timed-out or cancelled job."""
    gate = jobs.fifo(tmp_path, "gate")  # never released
    with subreaper(), open_queue({UNTRUSTED: Lane(trusted=False)}) as q:
        worker = q.push_and_wait(Job("pid", jobs.worker_pid, lane=UNTRUSTED), timeout=WAIT)
        if how == "timeout":
            # The job must report its pids before its time runs out; on a loaded
            # machine it may not have, and then the attempt is repeated with a longer limit.
            for attempt, limit in enumerate((0.5, 4.0, 16.0)):
                report = str(tmp_path / f"pids-{attempt}")
                job = Job(
                    f"tree-{attempt}", jobs_control.tree_then_block, args=(gate, report), lane=UNTRUSTED, timeout=limit
                )
                failure = failure_of(q.push(job).handle, "timeout", timeout=limit + WAIT)
                if os.path.exists(report):
                    break
                worker = q.push_and_wait(Job(f"pid-{attempt}", jobs.worker_pid, lane=UNTRUSTED), timeout=WAIT)
            else:
                pytest.fail("the job never got as far as starting its children")
            pids = [int(p) for p in Path(report).read_text().split()]
        else:
            started = jobs.fifo(tmp_path, "started")
            handle = q.push(
                Job("tree", jobs_control.tree_then_block, args=(gate, None, started), lane=UNTRUSTED)
            ).handle
            pids = [int(p) for p in wait_started(handle, started).split()]
            assert q.cancel("tree") is True
            failure = failure_of(handle, "cancelled")
        assert len(pids) == 3 and worker not in pids
        assert failure.pid == worker and worker not in q._worker_pids()
        assert_all_gone([worker, *pids])
        assert q.push_and_wait(Job("after", jobs.square, args=(7,), lane=UNTRUSTED), timeout=WAIT) == 49


# --- Resource limits ------------------------------------------------------------------------


def test_a_fork_bomb_is_held_by_nproc(tmp_path: Any) -> None:
    nproc = 10
    lane = Lane(trusted=False, rlimits={"nproc": nproc})
    with subreaper(), open_queue({UNTRUSTED: lane}) as q:
        # The job reports how far it got before it blocks; the time limit may
        # run out before that on a loaded machine: then again, with a longer one.
        for attempt, limit in enumerate((1.0, 4.0, 16.0)):
            report = str(tmp_path / f"bomb-{attempt}")
            handle = q.push(
                Job(f"bomb-{attempt}", jobs_hostile.fork_bomb, args=(report, 20 * nproc), lane=UNTRUSTED, timeout=limit)
            ).handle
            failure = failure_of(handle, "timeout", timeout=limit + WAIT)
            if os.path.exists(report) and Path(report).read_text():
                break
        else:
            pytest.fail("the fork bomb never got as far as reporting")
        result = json.loads(Path(report).read_text())
        if result["uid"] != 0:
            # Stopped by the limit (EAGAIN), not by running out of attempts.
            assert result["errno"] == errno.EAGAIN, result
            assert result["forks"] < nproc, result
        else:
            # Run as root, the job stays uid 0 (it has no capability left to
            # change its uid), to which the kernel never applies RLIMIT_NPROC:
            # only the time limit holds it, and every process it forked dies.
            assert os.getuid() == 0 and result["forks"] == 20 * nproc, result
        assert_all_gone(result["pids"])
        assert failure.pid not in q._worker_pids()
        assert q.push_and_wait(Job("after", jobs.square, args=(3,), lane=UNTRUSTED), timeout=WAIT) == 9


def test_a_huge_file_is_held_by_fsize(tmp_path: Any) -> None:
    path = tmp_path / "huge"
    with open_queue({UNTRUSTED: Lane(trusted=False, rlimits={"fsize": "1M"})}) as q:
        pid = q.push_and_wait(Job("pid", jobs.worker_pid, lane=UNTRUSTED), timeout=WAIT)
        failure = failure_of(
            q.push(Job("huge", jobs_hostile.write_file, args=(str(path), 10), lane=UNTRUSTED)).handle, "error"
        )
        assert (failure.exc_type, failure.message) == ("OSError", f"OSError: [Errno {errno.EFBIG}] File too large")
        assert failure.pid == pid
        assert 0 < path.stat().st_size <= 1 << 20
        # The worker lives on, still held by the limit.
        assert (
            q.push_and_wait(
                Job("small", jobs_hostile.write_file, args=(str(tmp_path / "small"), 1), lane=UNTRUSTED), timeout=WAIT
            )
            == 1 << 20
        )
        assert q.push_and_wait(Job("pid", jobs.worker_pid, lane=UNTRUSTED), timeout=WAIT) == pid


def test_descriptors_are_held_by_nofile() -> None:
    with open_queue({UNTRUSTED: Lane(trusted=False, rlimits={"nofile": 16})}) as q:
        result = q.push_and_wait(Job("open", jobs_hostile.open_files, args=(100,), lane=UNTRUSTED), timeout=WAIT)
        assert result["errno"] == errno.EMFILE, result
        assert 0 < result["opened"] < 16, result


def test_a_cpu_spin_is_held_by_cpu() -> None:
    with open_queue({UNTRUSTED: Lane(trusted=False, rlimits={"cpu": 1})}) as q:
        handle = q.push(Job("spin", jobs_hostile.spin_forever, lane=UNTRUSTED, timeout=30)).handle
        failure = failure_of(handle, "timeout")
        assert (failure.signal, failure.exitcode) == ("SIGXCPU", -24)
        assert re.fullmatch(
            rf"the process running job 'spin' \(forked by worker {failure.pid} of lane 'u'\) was killed by SIGXCPU "
            r"\(signal 24\): the job used up its CPU-time limit \(the lane's rlimits\['cpu'\]\)",
            failure.message,
        ), failure.message
        assert q.push_and_wait(Job("after", jobs.square, args=(3,), lane=UNTRUSTED), timeout=WAIT) == 9


def test_the_cpu_limit_is_per_job() -> None:
    """Each job's process counts its CPU time from zero: jobs that together
    use more than the limit all complete on the same worker."""
    with open_queue({UNTRUSTED: Lane(workers=1, trusted=False, rlimits={"cpu": 1})}) as q:
        pid = q.push_and_wait(Job("pid", jobs.worker_pid, lane=UNTRUSTED), timeout=WAIT)
        for i in range(2):
            assert (
                q.push_and_wait(Job(f"burn-{i}", jobs_hostile.burn_cpu, args=(0.6,), lane=UNTRUSTED), timeout=WAIT)
                >= 0.6
            )
        assert q.push_and_wait(Job("pid-again", jobs.worker_pid, lane=UNTRUSTED), timeout=WAIT) == pid


def test_the_memory_limit_is_per_job_and_costs_no_worker() -> None:
    """Each job gets the whole memory_limit, whatever the jobs before it left
    behind (nothing: each runs in a fresh copy of the worker); a job past it
    fails with kind "memory" and its worker stays."""
    with open_queue({UNTRUSTED: Lane(workers=1, trusted=False, memory_limit="64M")}) as q:
        pid = q.push_and_wait(Job("pid", jobs.worker_pid, lane=UNTRUSTED), timeout=WAIT)
        for i in range(2):
            assert q.push_and_wait(Job(f"hoard-{i}", jobs_hostile.hoard, args=(40,), lane=UNTRUSTED), timeout=WAIT) == 0
        failure = failure_of(q.push(Job("greedy", jobs_control.allocate, args=(100,), lane=UNTRUSTED)).handle, "memory")
        assert failure.message == "MemoryError (the job went over its memory_limit of 64 MiB)"
        assert failure.pid == pid
        assert (
            q.push_and_wait(Job("after", jobs_control.allocate, args=(40,), lane=UNTRUSTED), timeout=WAIT) == 40 << 20
        )
        assert q.push_and_wait(Job("pid-again", jobs.worker_pid, lane=UNTRUSTED), timeout=WAIT) == pid
        assert q.stats().lanes[UNTRUSTED].worker_restarts == 0


def test_a_job_cannot_raise_its_limits() -> None:
    """The CPU and memory limits are hard limits in the job's own process."""
    lane = Lane(trusted=False, rlimits={"cpu": 5}, memory_limit="256M")
    with open_queue({UNTRUSTED: lane}) as q:
        tried = q.push_and_wait(Job("raise", jobs_hostile.raise_own_limits, lane=UNTRUSTED), timeout=WAIT)
        assert tried == {"cpu": "ValueError", "as": "ValueError"}


# --- Honest jobs, results as data ------------------------------------------------------------


def test_a_result_over_max_result_bytes_fails_but_keeps_the_worker(q: ProcQueue) -> None:
    pid = q.push_and_wait(Job("pid", jobs.worker_pid, lane=UNTRUSTED), timeout=WAIT)
    failure = failure_of(
        q.push(Job("big", jobs_hostile.text_of_size, args=(2 * LIMIT,), lane=UNTRUSTED)).handle, "protocol"
    )
    assert failure.exc_type == "ResultTooLarge" and failure.pid == pid
    assert re.fullmatch(
        rf"ResultTooLarge: the job's result is \d+ bytes, more than the lane's max_result_bytes of {LIMIT}",
        failure.message,
    ), failure.message
    # Just under the limit passes; and the worker is the same one.
    fits = Job("fits", jobs_hostile.text_of_size, args=(LIMIT - 100,), lane=UNTRUSTED)
    assert q.push_and_wait(fits, timeout=WAIT) == "x" * (LIMIT - 100)
    assert q.push_and_wait(Job("pid-again", jobs.worker_pid, lane=UNTRUSTED), timeout=WAIT) == pid
    lane = q.stats().lanes[UNTRUSTED]
    assert (lane.worker_restarts, lane.crashes, lane.failed) == (0, 0, 1)


@pytest.mark.parametrize("kind", ["set", "object", "bytes"])
def test_a_result_json_cannot_hold_fails_with_a_clear_message(q: ProcQueue, kind: str) -> None:
    failure = failure_of(q.push(Job(kind, jobs_hostile.awkward_result, args=(kind,), lane=UNTRUSTED)).handle, "error")
    assert failure.exc_type == "TypeError"
    assert failure.message == (
        f"TypeError: Object of type {kind} is not JSON serializable (the job's result, a {kind}, could not be "
        "encoded as JSON (an untrusted lane's results must be))"
    )
    _assert_lane_works(q)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ((1, (2, 3)), [1, [2, 3]]),
        ({"a": [1, 2.5, None, True, "é", {"b": []}]}, {"a": [1, 2.5, None, True, "é", {"b": []}]}),
        ("text", "text"),
        (None, None),
        (2**70, 2**70),
    ],
    ids=["tuples-become-lists", "nested", "str", "none", "big-int"],
)
def test_json_results_come_back_as_data(q: ProcQueue, value: Any, expected: Any) -> None:
    assert q.push_and_wait(Job("v", jobs.identity, args=(value,), lane=UNTRUSTED), timeout=WAIT) == expected
    assert q.state("v") == Completed(expected)


def test_an_exception_comes_back_as_text(q: ProcQueue) -> None:
    with pytest.raises(JobFailed, match=r"^job 'bad' failed: error: ValueError: bad input$") as info:
        q.push_and_wait(Job("bad", jobs.boom, args=("bad input",), lane=UNTRUSTED), timeout=WAIT)
    failure = info.value.failure
    assert (failure.kind, failure.exc_type, failure.message) == ("error", "ValueError", "ValueError: bad input")
    assert failure.exception is None and failure.traceback is not None
    assert type(info.value.__cause__) is _RemoteTraceback and str(info.value.__cause__) == failure.traceback
    assert "in boom" in failure.traceback and failure.traceback.rstrip().endswith("ValueError: bad input")
    assert failure.pid in q._worker_pids()  # an exception does not cost the worker
    _assert_lane_works(q)


def test_a_push_to_an_untrusted_lane_is_queued_like_any(q: ProcQueue) -> None:
    outcome = q.push(Job("sq", jobs.square, args=(9,), lane=UNTRUSTED))
    assert isinstance(outcome, Queued) and outcome.handle.result(timeout=WAIT) == 81
