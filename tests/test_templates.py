"""A trusted lane's template (``procq._worker.template``): the lane's replacements
and spares fork from a booted process of the lane, and every supervision
promise holds for them: exact exit codes and signals, a dead template
replaced, nothing left when the queue closes or the supervisor is killed,
untrusted lanes untouched."""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import jobs
import psutil
import pytest
from core_support import failure_of, open_queue, wait_until
from process_support import assert_all_gone, descendants_tagged, linux_only, tagged_program

from procq import Job, Lane, ProcQueue
from procq._worker.template import Template

TESTS_DIR = str(Path(__file__).parent)


def templates(q: ProcQueue, lane: str = "default") -> list[Template]:
    # (A trusted lane keeps its templates in a list; an untrusted one keeps a dict of what its channel needs.)
    kept = q._supervisor._launch.lanes.get(lane, [])
    return [t for t in (kept.values() if isinstance(kept, dict) else kept) if isinstance(t, Template)]


def whoami() -> tuple[int, int]:
    return os.getpid(), os.getppid()


def crash(q: ProcQueue, key: str, lane: str | None = None) -> None:
    failure_of(q.push(Job(key, jobs.sigkill_self, lane=lane)).handle, "crashed")


def forkserver_pid() -> int:
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver
    return int(server._forkserver_pid)


def test_a_replacement_is_forked_by_the_lanes_template() -> None:
    with open_queue({"default": Lane(workers=1, spare_workers=0)}) as q:
        first_pid, first_parent = q.push_and_wait(Job("first", whoami))
        assert first_parent == forkserver_pid()  # the queue's first workers start through the forkserver
        crash(q, "die")
        pid, parent = q.push_and_wait(Job("after", whoami))
        (template,) = templates(q)
        assert pid != first_pid and parent == template.pid
        assert psutil.Process(template.pid).ppid() == forkserver_pid()
        # A function sent by value runs there too.
        assert q.push_and_wait(Job("lambda", lambda x: x * 2, args=(21,))) == 42


EXITS = [
    (jobs.sigkill_self, (), -signal.SIGKILL, "SIGKILL"),
    (jobs.exit_now, (7,), 7, None),
    (jobs.exit_now, (0,), 0, None),
    (os.kill, ("pid", signal.SIGSEGV), -signal.SIGSEGV, "SIGSEGV"),
    (os.abort, (), -signal.SIGABRT, "SIGABRT"),
]


def _die(fn: Any, args: tuple[Any, ...]) -> None:
    fn(*(os.getpid() if a == "pid" else a for a in args))


@pytest.mark.parametrize(("fn", "args", "exitcode", "signame"), EXITS, ids=[str(e[2]) for e in EXITS])
def test_exit_codes_and_signals_of_a_template_forked_worker_are_exact(
    fn: Any, args: tuple[Any, ...], exitcode: int, signame: str | None
) -> None:
    with open_queue({"default": Lane(workers=1, spare_workers=0)}) as q:
        crash(q, "first")  # the next worker is the template's
        pid, parent = q.push_and_wait(Job("who", whoami))
        assert parent == templates(q)[0].pid
        failure = failure_of(q.push(Job("die", _die, args=(fn, args))).handle, "crashed")
        assert (failure.exitcode, failure.signal, failure.pid) == (exitcode, signame, pid)


def test_a_dead_template_is_replaced_and_the_lane_keeps_its_workers() -> None:
    with open_queue({"default": Lane(workers=2, spare_workers=1)}) as q:
        crash(q, "first")
        wait_until(lambda: len(templates(q)) == 1, what="the template")
        (old,) = templates(q)
        crash(q, "second")  # a replacement from the template may still be booting: it must not outlive it
        os.kill(old.pid, signal.SIGKILL)
        wait_until(lambda: not old.alive(), what="the template's death")
        crash(q, "third")

        # The old template's workers die with it (as a forkserver's children do): a job
        # sent to one before the supervisor saw it go would fail with it. Wait for that.
        def from_live_parents() -> bool:
            live = {t.pid for t in templates(q) if t.alive()} | {forkserver_pid()}
            try:
                return all(_running(pid) and psutil.Process(pid).ppid() in live for pid in q._worker_pids())
            except psutil.NoSuchProcess:
                return False

        wait_until(from_live_parents, what="the old template's workers gone from the lane")
        assert q.push_and_wait(Job("after", jobs.square, args=(6,))) == 36

        def settled() -> bool:
            live = {t.pid for t in templates(q) if t.alive()}
            try:
                parents = {psutil.Process(pid).ppid() for pid in q._worker_pids()}
            except psutil.NoSuchProcess:  # one died meanwhile: not settled yet
                return False
            return len(q._worker_pids()) == 2 and bool(live) and parents <= live | {forkserver_pid()}

        # Every worker a child of a live template or of the forkserver: none
        # orphaned by the old template's death, none left short.
        wait_until(settled, what="the lane's workers, each from a live template or the forkserver")
        assert old.pid not in {t.pid for t in templates(q) if t.alive()}
        assert {q.push_and_wait(Job(f"sq{i}", jobs.square, args=(i,))) for i in range(4)} == {0, 1, 4, 9}


def test_templates_are_reaped_at_close() -> None:
    q = ProcQueue({"default": Lane(workers=1, spare_workers=1)})
    try:
        crash(q, "die")
        assert q.push_and_wait(Job("after", jobs.square, args=(3,))) == 9
        template = psutil.Process(templates(q)[0].pid)
    finally:
        q.close()
    assert not template.is_running()


def test_untrusted_lanes_have_no_template() -> None:
    with open_queue({"u": Lane(workers=1, trusted=False)}) as q:
        failure_of(q.push(Job("die", jobs.sigkill_self, lane="u")).handle, "crashed")
        assert q.push_and_wait(Job("after", os.getppid, lane="u")) != 0
        assert templates(q, "u") == []


_SUPERVISOR = """
import json, os, sys, time
sys.path.insert(0, {tests!r})
import jobs, jobs_hardening
from procq import Job, JobFailed, Lane, ProcQueue


def main():
    directory = sys.argv[1]
    q = ProcQueue({{"default": Lane(workers=2, spare_workers=1)}})
    try:
        q.push_and_wait(Job("die", jobs.sigkill_self), timeout=30)
    except JobFailed:
        pass
    deadline = time.monotonic() + 30
    while not q._supervisor._launch.lanes.get("default") and time.monotonic() < deadline:
        time.sleep(0.01)  # (the replacement's start, on the starter thread)
    template = q._supervisor._launch.lanes["default"][-1].pid
    pid_file = os.path.join(directory, "sleeper.pid")
    handle = q.push(Job("sleeper", jobs_hardening.start_sleeper, args=(pid_file,))).handle
    while not os.path.exists(pid_file):
        time.sleep(0.01)
    print(json.dumps([template, int(open(pid_file).read())]), flush=True)
    sys.stdin.read()  # until killed


if __name__ == "__main__":
    main()
"""


@pytest.mark.skipif(not linux_only, reason="needs PR_SET_CHILD_SUBREAPER to see orphans exit")
@pytest.mark.timeout(90)
def test_nothing_outlives_a_killed_supervisor_with_templates_in_place(tmp_path: Path) -> None:
    script = tmp_path / "supervisor.py"
    script.write_text(_SUPERVISOR.format(tests=TESTS_DIR))
    tag = uuid.uuid4().hex
    with tagged_program([sys.executable, str(script), str(tmp_path)], tag) as proc:
        assert proc.stdout is not None
        template, sleeper = json.loads(proc.stdout.readline())
        everything = descendants_tagged(tag)
        assert {template, sleeper} <= {p.pid for p in everything}
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert_all_gone(everything, tag, "a process")


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
