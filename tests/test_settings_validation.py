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
    which = {
        "nofile": resource.RLIMIT_NOFILE,
        "nproc": resource.RLIMIT_NPROC,
        "fsize": resource.RLIMIT_FSIZE,
        "cpu": resource.RLIMIT_CPU,
    }[name]
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


def test_env_messages_name_the_setting_and_the_rule() -> None:
    with pytest.raises(ValueError, match=r"^lane env name 'A=B' holds '=', which ends a name"):
        Lane(workers=1, env={"A=B": "x"})
    with pytest.raises(ValueError, match=r"^lane env\['NAME'\] holds NUL"):
        Lane(workers=1, env={"NAME": "a\0b"})
    with pytest.raises(TypeError, match=r"^lane env must be a mapping of str to str, got list$"):
        Lane(workers=1, env=[("A", "b")])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^lane env\['A'\] must be a str, got bytes"):
        Lane(workers=1, env={"A": b"x"})  # type: ignore[dict-item]
    assert Lane(workers=1, env={"A": "", "B": "x=y"}).env == {"A": "", "B": "x=y"}  # empty and '=' values are fine


@pytest.mark.parametrize("name", ["nofile", "nproc", "fsize", "cpu"])
def test_an_rlimit_up_to_the_hard_limit_is_taken(name: str) -> None:
    which = {"nofile": resource.RLIMIT_NOFILE, "nproc": resource.RLIMIT_NPROC,
             "fsize": resource.RLIMIT_FSIZE, "cpu": resource.RLIMIT_CPU}[name]  # fmt: skip
    _, hard = resource.getrlimit(which)
    top = 2**63 - 1 if hard == resource.RLIM_INFINITY else hard
    assert Lane(workers=1, rlimits={name: top}).rlimits == {name: top}
    with pytest.raises(ValueError, match=rf"^lane rlimits\[{name!r}\] must be an int of at least 1|^lane rlimits\["):
        Lane(workers=1, rlimits={name: 0})


def test_rlimit_messages_say_why() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        with pytest.raises(ValueError, match=rf"^lane rlimits\['nofile'\] must be at most {hard}, this process's hard"):
            Lane(workers=1, rlimits={"nofile": hard + 1})
    with pytest.raises(ValueError, match=r"^lane rlimits: unknown rlimit 'stack'; procq sets 'cpu', "):
        Lane(workers=1, rlimits={"stack": 1})
    with pytest.raises(ValueError, match=r"^lane rlimits\['fsize'\] must be a number of bytes"):
        Lane(workers=1, rlimits={"fsize": "lots"})


def test_a_working_directory_is_checked_as_a_path(tmp_path: Any) -> None:
    assert Lane(workers=1, cwd=tmp_path).cwd == str(tmp_path)  # a PathLike is taken, as a str
    with pytest.raises(ValueError, match=r"^lane cwd '.*nowhere' does not exist$"):
        Lane(workers=1, cwd=tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"^lane cwd '.*file' is not a directory$"):
        Lane(workers=1, cwd=tmp_path / "file")
    with pytest.raises(TypeError, match=r"^lane cwd must be a path, got bytes$"):
        Lane(workers=1, cwd=b"/tmp")  # type: ignore[arg-type]


def test_the_bound_on_workers_is_the_documented_one() -> None:
    from procq._model.job import MAX_WORKERS

    assert Lane(workers=MAX_WORKERS).workers == MAX_WORKERS  # a Lane starts nothing: only a queue does
    with pytest.raises(ValueError, match=rf"^lane workers must be at most {MAX_WORKERS} \(each is a process"):
        Lane(workers=MAX_WORKERS + 1)
    with pytest.raises(ValueError, match=rf"^lane workers must be at most {MAX_WORKERS}"):
        ProcQueue(lanes={"a": 1, "b": MAX_WORKERS + 1})


def test_workers_past_the_descriptor_limit_are_refused_at_procqueue() -> None:
    import os

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + 200, hard))
    try:
        with pytest.raises(ValueError, match=r"^the lanes' 80 workers need about \d+ file descriptors") as info:
            ProcQueue(lanes={"a": 40, "b": Lane(workers=40)})
        assert "RLIMIT_NOFILE" in str(info.value) and "ulimit -n" in str(info.value)
        assert "at most 45 workers fit" in str(info.value)  # (200 - 64 reserved) // 3 per worker
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_close_with_a_bool_still_works() -> None:
    with open_queue(1) as q:
        q.close(wait=False)
        assert q.closed
        q.close(wait=True)  # again: nothing
