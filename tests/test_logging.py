"""The ``procq`` loggers: silent by default; each decision of the supervisor
(a start, a death, a restart, a kill for a limit, a cancel, a protocol
violation, a lane backing off) is one record, at WARNING when a user must see
it, at DEBUG otherwise; none carries a job's arguments or output."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jobs
import jobs_hardening as hj
import jobs_hostile
import pytest
from core_support import Gates, failure_of, hold, open_queue

from procq import Job, Lane

SECRET = "s3cr3t-payload"


def records(caplog: pytest.LogCaptureFixture, name: str, level: int | None = None) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == name and (level is None or r.levelno == level)]


@pytest.fixture
def caplog_debug(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="procq")
    return caplog


def test_silent_by_default() -> None:
    """Nothing reaches stderr unless the application configures logging
    (the procq logger has a NullHandler, so not even the last resort)."""
    script = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, sys.argv[1])
        import jobs
        from procq import Job, JobFailed, ProcQueue

        if __name__ == "__main__":
            with ProcQueue(lanes=1) as q:
                try:
                    q.push_and_wait(Job("crash", jobs.sigkill_self))
                except JobFailed:
                    print("failed")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(Path(__file__).parent)], capture_output=True, text=True, timeout=50
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "failed\n"
    assert proc.stderr == ""


def test_a_worker_start_and_a_crash_are_logged(caplog_debug: pytest.LogCaptureFixture) -> None:
    with open_queue({"cpu": 1}) as q:
        with pytest.raises(Exception, match="crashed"):
            q.push_and_wait(Job("segv", jobs.segfault, lane="cpu"), timeout=20)
        assert q.push_and_wait(Job("after", jobs.square, args=(7,)), timeout=20) == 49
    starts = [r.getMessage() for r in records(caplog_debug, "procq.worker", logging.DEBUG) if "started" in r.msg]
    assert len(starts) >= 2  # the first worker and its replacement
    assert all(" (lane 'cpu')" in s for s in starts)
    [crash] = records(caplog_debug, "procq.worker", logging.WARNING)
    message = crash.getMessage()
    assert "SIGSEGV" in message and "while running job 'segv'; the job failed (crashed)" in message
    assert crash.procq_key == "segv" and crash.procq_signal == "SIGSEGV" and crash.procq_lane == "cpu"  # type: ignore[attr-defined]
    restarts = [r.getMessage() for r in records(caplog_debug, "procq.worker") if "to replace" in r.msg]
    assert restarts and "lane 'cpu' starts a worker to replace one that" in restarts[0]


def test_a_sigkill_and_an_exit_code_are_named(caplog: pytest.LogCaptureFixture) -> None:
    with open_queue(1) as q:
        for key, fn in (("killed", jobs.sigkill_self), ("exited", jobs.exit_now)):
            with pytest.raises(Exception, match="crashed"):
                q.push_and_wait(Job(key, fn), timeout=20)
    warnings = [r.getMessage() for r in records(caplog, "procq.worker", logging.WARNING)]
    assert len(warnings) == 2
    assert "SIGKILL" in warnings[0] and "job 'killed'" in warnings[0]
    assert "code 3" in warnings[1] and "job 'exited'" in warnings[1]


def test_a_timeout_kill(caplog_debug: pytest.LogCaptureFixture) -> None:
    with open_queue(1) as q:
        failure_of(q.push(Job("slow", jobs.block_forever, timeout=0.2)).handle, "timeout")
    [kill] = records(caplog_debug, "procq.job", logging.WARNING)
    assert kill.getMessage().startswith("job 'slow' ran past its time limit; its worker ")
    # The death that follows is the kill's, not a crash: DEBUG.
    assert not records(caplog_debug, "procq.worker", logging.WARNING)
    assert any("killed for job 'slow' (timeout)" in r.getMessage() for r in records(caplog_debug, "procq.worker"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memory is measured through /proc")
@pytest.mark.timeout(90)
def test_a_memory_kill(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    started, go = jobs.fifo(tmp_path, "started"), jobs.fifo(tmp_path, "hold")
    with open_queue({"one": Lane(workers=1)}) as q:
        handle = q.push(Job("hogs", hj.allocating_children, args=(4, 60, started, go), memory_limit="120M")).handle
        try:
            failure_of(handle, "memory", timeout=30)
        finally:
            os.close(jobs.release(go))
    [kill] = records(caplog, "procq.job", logging.WARNING)
    assert kill.getMessage().startswith("job 'hogs' went over its memory limit (125829120 bytes;")


def test_a_cancel(caplog_debug: pytest.LogCaptureFixture, gates: Gates) -> None:
    with open_queue(1) as q:
        handle, pid, _ = hold(q, gates, "held")
        assert q.cancel("held")
        failure_of(handle, "cancelled")
    [cancel] = [r.getMessage() for r in records(caplog_debug, "procq.job") if "cancelled" in r.msg]
    assert cancel == f"job 'held' was cancelled while running; its worker {pid} is killed"
    assert not [r for r in caplog_debug.records if r.levelno >= logging.WARNING]


def test_a_protocol_violation(caplog: pytest.LogCaptureFixture) -> None:
    with open_queue({"u": Lane(workers=1, trusted=False)}) as q:
        handle = q.push(Job("liar", jobs_hostile.write_then_exit, args=(jobs_hostile.frame(b"\xff junk"),))).handle
        failure_of(handle, "protocol")
    [violation] = records(caplog, "procq.worker", logging.WARNING)
    message = violation.getMessage()
    assert "(lane 'u') broke procq's protocol with " in message
    assert message.endswith("; killed, job 'liar' failed (protocol)")


def test_no_payload_in_any_record(caplog_debug: pytest.LogCaptureFixture) -> None:
    with open_queue(1) as q:
        with pytest.raises(Exception, match=SECRET):
            q.push_and_wait(Job("err", jobs.boom, args=(SECRET,)), timeout=20)
        with pytest.raises(Exception, match="crashed"):
            q.push_and_wait(Job("crash", jobs.exit_now, args=(5,)), timeout=20)
        assert q.push_and_wait(Job("ok", str, args=(SECRET,)), timeout=20) == SECRET
    assert caplog_debug.records
    for record in caplog_debug.records:
        assert SECRET not in record.getMessage()


BOOT_SCRIPT = textwrap.dedent(
    """
    import logging, sys
    if __name__ == "__mp_main__":
        raise RuntimeError("this module refuses to be imported by a worker")

    from procq import Job, JobFailed, ProcQueue

    if __name__ == "__main__":
        logging.basicConfig(level=logging.WARNING, format="LOG %(name)s %(levelname)s %(message)s")
        with ProcQueue(lanes=1) as q:
            try:
                q.push_and_wait(Job("doomed", abs, args=(-1,)), timeout=30)
            except JobFailed as e:
                print("KIND", e.failure.kind)
    """
)


def test_a_lane_backing_off_when_workers_die_starting(tmp_path: Path) -> None:
    script = tmp_path / "refuses.py"
    script.write_text(BOOT_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=50, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "KIND crashed\n"
    lines = [line for line in proc.stderr.splitlines() if line.startswith("LOG ")]
    backoffs = [line for line in lines if "died while starting" in line]
    assert backoffs[0].startswith(
        "LOG procq.worker WARNING lane 'default': a worker died while starting (exited with code 1; 1 in a row); "
        "next start in 0.05s"
    )
    assert backoffs[2].endswith("3 in a row); next start in 0.2s; its waiting jobs fail")
    # Dying while starting is the backoff's story, not a crash of a job.
    assert not [line for line in lines if "while running job" in line or "held no job" in line]
