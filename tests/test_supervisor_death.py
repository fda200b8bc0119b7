"""When the supervisor dies (SIGKILL, or SIGTERM with Python's default
handling), every process any job started goes with its workers: not only
procq's own processes, but a job's plain children too."""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
from process_support import assert_all_gone, children, descendants_tagged, linux_only, tagged_program

from procq import Job

TESTS_DIR = str(Path(__file__).parent)

_SUPERVISOR = """
import json, os, sys, time
sys.path.insert(0, {tests!r})
import jobs_hardening
from procq import Job, Lane, ProcQueue


def main():
    method, directory = sys.argv[1:3]
    # An untrusted lane's workers inherit no environment: the tag the test finds processes by is given to them.
    tag = {{"PROCQ_TEST_TAG": os.environ["PROCQ_TEST_TAG"]}}
    q = ProcQueue({{"trusted": 1, "untrusted": Lane(workers=1, trusted=False, env=tag)}}, start_method=method)
    files = [os.path.join(directory, name) for name in ("trusted.pid", "untrusted.pid")]
    q.push(Job("trusted", jobs_hardening.start_sleeper, args=(files[0],), lane="trusted"))
    q.push(Job("untrusted", jobs_hardening.start_sleeper, args=(files[1],), lane="untrusted"))
    while not all(os.path.exists(f) for f in files):
        time.sleep(0.01)
    print(json.dumps([int(open(f).read()) for f in files]), flush=True)
    sys.stdin.read()  # until killed


if __name__ == "__main__":
    main()
"""


_TREES = """
import json, os, sys, time
sys.path.insert(0, {tests!r})
import jobs_leftovers
from procq import Job, Lane, ProcQueue


def main():
    method, directory = sys.argv[1:3]
    tag = {{"PROCQ_TEST_TAG": os.environ["PROCQ_TEST_TAG"]}}
    q = ProcQueue({{"trusted": 1, "untrusted": Lane(workers=1, trusted=False, env=tag)}}, start_method=method)
    files = [os.path.join(directory, name) for name in ("trusted.pids", "untrusted.pids")]
    q.push(Job("trusted", jobs_leftovers.start_tree, args=(files[0],), lane="trusted"))
    q.push(Job("untrusted", jobs_leftovers.start_tree, args=(files[1],), lane="untrusted"))
    while not all(os.path.exists(f) for f in files):
        time.sleep(0.01)
    print(json.dumps([int(p) for f in files for p in open(f).read().split()]), flush=True)
    sys.stdin.read()  # until killed


if __name__ == "__main__":
    main()
"""


def _read_line(stream: Any) -> str:
    line = stream.readline()
    if not line:
        raise EOFError("the supervisor exited before printing its jobs' children")
    return str(line.decode())


@pytest.mark.skipif(not linux_only, reason="needs PR_SET_CHILD_SUBREAPER to see orphans exit")
@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("program", [_SUPERVISOR, _TREES], ids=["child", "grandchild+stopped"])
def test_a_jobs_children_die_with_the_supervisor(start_method: str, tmp_path: Path, how: int, program: str) -> None:
    """A job's child; and a grandchild and a stopped child, in a trusted and an untrusted lane."""
    script = tmp_path / "supervisor.py"
    script.write_text(program.format(tests=TESTS_DIR))
    tag = uuid.uuid4().hex
    with tagged_program([sys.executable, str(script), start_method, str(tmp_path)], tag) as proc:
        sleepers = json.loads(_read_line(proc.stdout))
        procs = [psutil.Process(pid) for pid in sleepers]
        everything = descendants_tagged(tag)
        assert set(sleepers) <= {p.pid for p in everything}
        proc.send_signal(how)
        assert proc.wait(timeout=10) == -how
        assert_all_gone(procs, tag, "a job's child")


def test_the_undertaker_is_gone_after_close(start_method: str) -> None:
    """The process that outlives a dead supervisor to kill its workers' groups
    is the supervisor's child while the queue lives, and is reaped by close()."""
    from procq import ProcQueue

    before = set(children())
    q = ProcQueue({"a": 1}, start_method=start_method)
    try:
        assert q.push_and_wait(Job("k", os.getpid)) > 0  # (the queue is running)
        ours = [p for pid, p in children().items() if pid not in before and "-S" in p.cmdline()]
        assert len(ours) == 1 and ours[0].ppid() == os.getpid()
    finally:
        q.close()
    assert not ours[0].is_running()
