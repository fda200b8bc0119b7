"""Settings a worker could never start with, or a queue could never honour,
are refused where they are written: at ``Lane()``, ``ProcQueue()`` or the
call, with a message that names the problem."""

from __future__ import annotations

import resource
from typing import Any

import jobs_control
import pytest
from core_support import open_queue

from procq import Job, Lane, ProcQueue


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"A=B": "x"}, "="),
        ({"": "x"}, "empty"),
        ({"NAME": "a\0b"}, "NUL"),
        ({"NA\0ME": "x"}, "NUL"),
        ({1: "x"}, "str"),
        ({"NAME": 1}, "str"),
    ],
    ids=["equals-in-name", "empty-name", "nul-in-value", "nul-in-name", "non-str-name", "non-str-value"],
)
def test_a_bad_environment_is_refused_at_lane(env: dict[Any, Any], problem: str) -> None:
    with pytest.raises((ValueError, TypeError), match=r"env") as info:
        Lane(workers=1, env=env)
    assert problem in str(info.value)


@pytest.mark.parametrize("trusted", [True, False])
def test_a_good_environment_reaches_the_worker(trusted: bool) -> None:
    with open_queue({"l": Lane(workers=1, env={"PROCQ_X": "a=b c", "PATH": "/usr/bin:/bin"}, trusted=trusted)}) as q:
        assert q.push_and_wait(Job("env", jobs_control.environ))["PROCQ_X"] == "a=b c"


@pytest.mark.parametrize("name", ["nofile", "nproc", "fsize", "cpu"])
def test_an_rlimit_above_what_the_system_allows_is_refused(name: str) -> None:
    which = {"nofile": resource.RLIMIT_NOFILE, "nproc": resource.RLIMIT_NPROC,
             "fsize": resource.RLIMIT_FSIZE, "cpu": resource.RLIMIT_CPU}[name]
    _, hard = resource.getrlimit(which)
    too_big = 2**63 if hard == resource.RLIM_INFINITY else hard + 1  # 2**63: past what any rlimit can hold
    with pytest.raises(ValueError, match=rf"rlimits\[{name!r}\]"):
        Lane(workers=1, rlimits={name: too_big})


def test_a_missing_working_directory_is_refused(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="cwd"):
        Lane(workers=1, cwd=str(tmp_path / "nowhere"))
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(ValueError, match="cwd"):
        Lane(workers=1, cwd=str(file))


@pytest.mark.parametrize("workers", [10**9, 100_000])
def test_an_absurd_worker_count_is_refused(workers: int) -> None:
    with pytest.raises(ValueError, match="workers"):
        Lane(workers=workers)
    with pytest.raises(ValueError, match="workers"):
        ProcQueue(lanes=workers)


@pytest.mark.parametrize("wait", ["no", 0, 1, None, "False"])
def test_close_takes_only_a_bool(wait: Any) -> None:
    with open_queue(1) as q:
        with pytest.raises(TypeError, match="wait"):
            q.close(wait=wait)
        assert not q.closed
