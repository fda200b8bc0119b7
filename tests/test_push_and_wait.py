"""push_and_wait: cached output, JobFailed, joining a running job, and a timeout that leaves the
job running and names the caller's timeout."""

from __future__ import annotations

import asyncio

import jobs
import jobs_core
import pytest
from core_support import WAIT, BlockingCall, Gates, read_log

from procq import Cached, Failed, Job, JobFailed, Processing, ProcQueue


@pytest.mark.key_decides  # pushes other work under a held key on purpose: on_mismatch="ignore"
def test_push_and_wait_returns_cached_output_and_raises_job_failed(queue: ProcQueue, log: str) -> None:
    pid = queue.push_and_wait(Job("p", jobs_core.record, args=(log,)), timeout=WAIT)
    assert queue.push(Job("p", jobs_core.record, args=(log,))) == Cached(pid)
    assert queue.push_and_wait(Job("p", jobs_core.record, args=(log, "again")), timeout=WAIT) == pid
    assert queue.push_and_wait(Job("p", jobs_core.record, args=(log, "again"))) == pid
    assert read_log(log) == [f"ran {pid}"]
    with pytest.raises(JobFailed, match=r"^job 'e' failed: error: ValueError: nope$"):
        queue.push_and_wait(Job("e", jobs.boom, args=("nope",)), timeout=WAIT)
    assert isinstance(queue.state("e"), Failed)

    async def main() -> None:
        assert await queue.apush_and_wait(Job("p", jobs.boom), timeout=WAIT) == pid
        with pytest.raises(JobFailed, match=r"^job 'e2' failed: error: ValueError: async nope$"):
            await queue.apush_and_wait(Job("e2", jobs.boom, args=("async nope",)))

    asyncio.run(main())
    assert read_log(log) == [f"ran {pid}"]


@pytest.mark.key_decides  # pushes other work under a held key on purpose: on_mismatch="ignore"
def test_push_and_wait_joins_a_running_job(queue: ProcQueue, gates: Gates, log: str) -> None:
    gate = gates("held")
    first = queue.push(Job("held", jobs_core.record_signal_wait, args=(log, gate.started, gate.go)))
    pid = gate.wait_started()
    joiner = BlockingCall(lambda: queue.push_and_wait(Job("held", jobs_core.record, args=(log,)), timeout=WAIT))
    joiner.wait_blocked()  # waiting on the running job
    gate.open()
    assert joiner.outcome() == pid == first.handle.result(timeout=WAIT)
    assert read_log(log) == [f"ran {pid}"]


def test_push_and_wait_past_its_timeout_leaves_the_job_running(queue: ProcQueue, gates: Gates, log: str) -> None:
    gate = gates("slow")
    job = Job("slow", jobs_core.record_signal_wait, args=(log, gate.started, gate.go))
    first = queue.push(job)
    pid = gate.wait_started()
    with pytest.raises(TimeoutError, match=r"^job 'slow' has not finished after "):
        queue.push_and_wait(job, timeout=0.2)
    assert queue.state("slow") == Processing()

    async def main() -> None:
        with pytest.raises(TimeoutError, match=r"^job 'slow' has not finished after 0\.2s; it keeps running$"):
            await queue.apush_and_wait(job, timeout=0.2)

    asyncio.run(main())
    assert queue.state("slow") == Processing()
    gate.open()
    assert queue.push_and_wait(job, timeout=WAIT) == pid
    assert first.handle.result(timeout=0) == pid
    assert read_log(log) == [f"ran {pid}"]


def test_push_and_wait_timeout_message_names_the_callers_timeout(queue: ProcQueue, gates: Gates, log: str) -> None:
    # push_and_wait(timeout=0.2) should say "after 0.2s", as apush_and_wait does,
    # not the remainder of the timeout left once the push returned.
    gate = gates("slow")
    job = Job("slow", jobs_core.record_signal_wait, args=(log, gate.started, gate.go))
    queue.push(job)
    gate.wait_started()
    with pytest.raises(TimeoutError, match=r"^job 'slow' has not finished after 0\.2s; it keeps running$"):
        queue.push_and_wait(job, timeout=0.2)
    gate.open()
    assert queue.push_and_wait(job, timeout=WAIT) == int(read_log(log)[0].split()[1])
