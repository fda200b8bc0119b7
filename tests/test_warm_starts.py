"""Learned warm starts (``procq._worker.warm``): a trusted lane's template
imports the modules its jobs needed as they unpickled, so that replacements
fork with them; a module that cannot be imported there, or that starts a
thread as it is imported, is dropped, logged once, and never tried again.

Each job module here notes in which process it was imported
(``IMPORTED_IN``): a worker that imported it itself answers its own pid; a
worker forked from a template that had imported it answers the template's.
No test module imports them at its top, so the forkserver never has them:
the lane learns them from its first worker."""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from core_support import failure_of, open_queue
from process_support import linux_only

from procq import Job, Lane, ProcQueue
from procq._worker.template import LaneTemplates

pytestmark = pytest.mark.skipif(not linux_only, reason="templates fork where the forkserver and pidfds are: Linux")

TESTS_DIR = str(Path(__file__).parent)
ENV = {"PROCQ_TEST_WARM_WORKER": "1"}  # (see jobs_warm_refused)


def lane_templates(q: ProcQueue, lane: str = "default") -> LaneTemplates:
    kept: LaneTemplates = q._supervisor._launch.lanes[lane]
    return kept


def crash_and_ask(q: ProcQueue, module: ModuleType, times: int) -> list[tuple[int, int]]:
    """Kill a worker, then ask a worker where the module was imported, ``times`` times."""
    import jobs

    answers = []
    for n in range(times):
        failure_of(q.push(Job(f"die-{n}", jobs.sigkill_self)).handle, "crashed")
        answers.append(q.push_and_wait(Job(f"where-{n}", module.where)))
    return answers


def warnings_about(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "procq.worker" and f"import {name!r}" in r.getMessage()]


def test_a_lazily_imported_job_module_is_imported_once_per_template_not_once_per_worker() -> None:
    module = importlib.import_module("jobs_warm")
    with open_queue({"default": Lane(workers=2)}) as q:
        first_pids = set(q._worker_pids())
        first_pid, imported_in = q.push_and_wait(Job("first", module.where))
        assert imported_in == first_pid  # the queue's first worker imported it itself
        answers = crash_and_ask(q, module, 4)
        kept = lane_templates(q)
        assert "jobs_warm" in kept.learned.names()
        assert kept.learned.dropped() == {}
        (template,) = kept
        # Every replacement forked with the module that the template imported, once.
        replacements = [(pid, where) for pid, where in answers if pid not in first_pids]
        assert len(replacements) >= 3
        assert {where for _, where in replacements} == {template.pid}
        assert all(pid != where for pid, where in replacements)


def test_a_module_whose_import_raises_in_the_template_is_dropped_logged_once_and_not_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="procq.worker")
    with open_queue({"default": Lane(workers=1, env=ENV)}) as q:
        refused = _import_in_test("jobs_warm_refused")
        first_pid, imported_in = q.push_and_wait(Job("first", refused.where))
        assert imported_in == first_pid
        answers = crash_and_ask(q, refused, 3)
        # Each replacement imported it itself (the template could not), and ran the job.
        assert all(pid == where for pid, where in answers)
        assert len({pid for pid, _ in answers}) == 3
        learned = lane_templates(q).learned
        assert "jobs_warm_refused" not in learned.names()
        assert "ImportError: jobs_warm_refused imports only in a worker" in learned.dropped()["jobs_warm_refused"]
    (message,) = warnings_about(caplog, "jobs_warm_refused")  # logged once: never tried again
    assert "importing it raised ImportError" in message


def test_a_module_that_starts_a_thread_as_it_is_imported_is_dropped_and_its_template_forks_no_more(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="procq.worker")
    threads = _import_in_test("jobs_warm_threads")
    with open_queue({"default": Lane(workers=1)}) as q:
        q.push_and_wait(Job("first", threads.where))
        answers = crash_and_ask(q, threads, 2)
        assert all(pid == where for pid, where in answers)
        kept = lane_templates(q)
        assert "thread" in kept.learned.dropped()["jobs_warm_threads"]
        # The template that imported it forked nothing after; a new one took its place.
        assert kept[0].retired
        assert all(where not in {t.pid for t in kept} for _, where in answers)
    (message,) = warnings_about(caplog, "jobs_warm_threads")
    assert "started 1 thread(s)" in message


def test_numpy_is_learned_without_a_thread_in_the_template() -> None:
    """numpy's OpenBLAS starts threads as it loads; the template imports it
    with the pools' variables set to 1, so it keeps numpy, stays single-threaded
    and forks replacements that run BLAS."""
    try:
        import numpy  # noqa: F401  (the test extra's scikit-learn brings it)
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip("numpy is not installed (pip install 'procq[test]')")
    module = _import_in_test("jobs_warm_numpy")
    with open_queue({"default": Lane(workers=1)}) as q:
        q.push_and_wait(Job("first", module.where))
        answers = crash_and_ask(q, module, 2)
        kept = lane_templates(q)
        assert not [name for name in kept.learned.dropped() if name.split(".")[0] == "numpy"]
        (template,) = kept
        assert [where for _, where in answers] == [template.pid] * 2
        assert q.push_and_wait(Job("blas", module.blas_sum)) == 2500.0
        assert len(os.listdir(f"/proc/{template.pid}/task")) == 1


NOTEBOOK_LIKE = """
import json, sys
sys.path.insert(0, {tests!r})
import jobs, jobs_warm
from procq import Job, JobFailed, Lane, ProcQueue

with ProcQueue({{"default": Lane(workers=1)}}) as q:
    answers = [q.push_and_wait(Job("first", jobs_warm.where))]
    for n in range(3):
        try:
            q.push_and_wait(Job(f"die-{{n}}", jobs.sigkill_self))
        except JobFailed:
            pass
        answers.append(q.push_and_wait(Job(f"where-{{n}}", jobs_warm.where)))
    templates = [t.pid for t in q._supervisor._launch.lanes["default"]]
print(json.dumps({{"answers": answers, "templates": templates}}))
"""


def test_a_program_with_no_main_file_gets_warm_replacements(tmp_path: Path) -> None:
    """``python -c`` (as a notebook: no main file for the forkserver to import)."""
    proc = subprocess.run(
        [sys.executable, "-c", NOTEBOOK_LIKE.format(tests=TESTS_DIR)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    (first_pid, first_where), *replacements = seen["answers"]
    assert first_where == first_pid
    (template,) = seen["templates"]
    assert [where for _, where in replacements] == [template] * 3
    assert len({pid for pid, _ in replacements}) == 3


def _import_in_test(name: str) -> ModuleType:
    """A job module, imported here (the supervisor's side needs its functions) and
    never at this file's top: see the module docstring."""
    if name == "jobs_warm_refused":
        os.environ.update(ENV)  # (it imports only where this is set; the lane sets it in its workers)
        try:
            return importlib.import_module(name)
        finally:
            for key in ENV:
                os.environ.pop(key, None)
    return importlib.import_module(name)
