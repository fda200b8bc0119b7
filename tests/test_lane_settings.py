"""Lane and job settings checked when they are made: rlimits, sizes (memory_limit, max_worker_rss,
max_result_bytes), timeouts, the other lane settings, and the defaults that depend on trust.
Nothing here starts a process."""

from __future__ import annotations

from typing import Any

import jobs
import pytest

from procq import Job, Lane

MIB = 1 << 20


@pytest.mark.parametrize(
    ("rlimits", "error", "match"),
    [
        (
            {"stack": 10},
            ValueError,
            r"^lane rlimits: unknown rlimit 'stack'; procq sets 'cpu', 'fsize', 'nofile', 'nproc'$",
        ),
        (
            {"cpu": 0},
            ValueError,
            r"^lane rlimits\['cpu'\] must be an int of at least 1 \(seconds of CPU time per job\), got 0$",
        ),
        (
            {"nofile": "64"},
            ValueError,
            r"^lane rlimits\['nofile'\] must be an int of at least 1 \(open file descriptors\), got '64'$",
        ),
        ({"nproc": True}, ValueError, r"^lane rlimits\['nproc'\] must be an int of at least 1 .*, got True$"),
        ({"nproc": -3}, ValueError, r"^lane rlimits\['nproc'\] must be an int of at least 1 .*, got -3$"),
        (
            {"fsize": "lots"},
            ValueError,
            r"^lane rlimits\['fsize'\] must be a number of bytes or a string such as '512M' or '2G', got 'lots'$",
        ),
        ({"fsize": 0}, ValueError, r"^lane rlimits\['fsize'\] must be at least 1 byte, got 0$"),
        (
            {"fsize": 1.5},
            TypeError,
            r"^lane rlimits\['fsize'\] must be a number of bytes or a string such as '512M', got float$",
        ),
        ([("cpu", 1)], TypeError, r"^lane rlimits must be a mapping such as \{'cpu': 10\}, got list$"),
    ],
)
def test_bad_rlimits_are_refused(rlimits: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Lane(rlimits=rlimits)


def test_rlimits_are_normalized() -> None:
    lane = Lane(rlimits={"cpu": 5, "fsize": "1M", "nofile": 64, "nproc": 100})
    assert lane.rlimits == {"cpu": 5, "fsize": MIB, "nofile": 64, "nproc": 100}


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (1, 1),
        (4096, 4096),
        ("512M", 512 * MIB),
        ("2G", 2 << 30),
        ("1.5GiB", 3 << 29),
        ("64k", 64 << 10),
        (" 3 MB ", 3 * MIB),
        ("100", 100),
    ],
)
def test_sizes(size: Any, expected: int) -> None:
    assert Job("k", jobs.square, memory_limit=size).memory_limit == expected
    lane = Lane(memory_limit=size, max_worker_rss=size, max_result_bytes=size)
    assert (lane.memory_limit, lane.max_worker_rss, lane.max_result_bytes) == (expected, expected, expected)


_NOT_A_SIZE = r"must be a number of bytes or a string such as '512M' or '2G', got "


@pytest.mark.parametrize(
    ("size", "error", "match"),
    [
        ("lots", ValueError, _NOT_A_SIZE + r"'lots'$"),
        ("2X", ValueError, _NOT_A_SIZE + r"'2X'$"),
        ("-1M", ValueError, _NOT_A_SIZE + r"'-1M'$"),
        ("", ValueError, _NOT_A_SIZE + r"''$"),
        (-1, ValueError, r"must be at least 1 byte, got -1$"),
        (0, ValueError, r"must be at least 1 byte, got 0$"),
        ("0M", ValueError, r"must be at least 1 byte, got '0M'$"),
        (1.5, TypeError, r"must be a number of bytes or a string such as '512M', got float$"),
        (True, TypeError, r"must be a number of bytes or a string such as '512M', got bool$"),
    ],
)
def test_bad_sizes_are_refused(size: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=r"^job 'k': memory_limit " + match):
        Job("k", jobs.square, memory_limit=size)
    for name in ("memory_limit", "max_worker_rss", "max_result_bytes"):
        with pytest.raises(error, match=rf"^lane {name} " + match):
            Lane(**{name: size})


@pytest.mark.parametrize(
    ("timeout", "error", "match"),
    [
        (0, ValueError, r"must be a positive number of seconds, got 0$"),
        (-1.5, ValueError, r"must be a positive number of seconds, got -1\.5$"),
        (float("nan"), ValueError, r"must be a positive number of seconds, got nan$"),
        (float("inf"), ValueError, r"must be a positive number of seconds, got inf$"),
        ("1", TypeError, r"must be a number of seconds or None, got str$"),
        (True, TypeError, r"must be a number of seconds or None, got bool$"),
    ],
)
def test_bad_timeouts_are_refused(timeout: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=r"^job 'k': timeout " + match):
        Job("k", jobs.square, timeout=timeout)
    with pytest.raises(error, match=r"^lane timeout " + match):
        Lane(timeout=timeout)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"max_jobs_per_worker": 0},
            ValueError,
            r"^lane max_jobs_per_worker must be an int of at least 1 or None, got 0$",
        ),
        (
            {"max_jobs_per_worker": 2.0},
            ValueError,
            r"^lane max_jobs_per_worker must be an int of at least 1 or None, got 2\.0$",
        ),
        (
            {"kill_grace": -1},
            ValueError,
            r"^lane kill_grace must be a number of seconds from 0 to 3600 \(an hour\), got -1$",
        ),
        (
            {"kill_grace": "1s"},
            ValueError,
            r"^lane kill_grace must be a number of seconds from 0 to 3600 \(an hour\), got '1s'$",
        ),
        ({"trusted": "no"}, TypeError, r"^lane trusted must be a bool, got str$"),
        ({"inherit_env": 1}, TypeError, r"^lane inherit_env must be a bool or None, got int$"),
        ({"env": {"A": 1}}, TypeError, r"^lane env\['A'\] must be a str, got int: 1$"),
        ({"env": ["A=1"]}, TypeError, r"^lane env must be a mapping of str to str, got list$"),
        ({"cwd": "/no/such/directory"}, ValueError, r"^lane cwd '/no/such/directory' does not exist$"),
        ({"cwd": 3}, TypeError, r"^lane cwd must be a path, got int$"),
    ],
)
def test_bad_lane_settings_are_refused(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Lane(**kwargs)


def test_lane_defaults_depend_on_trust() -> None:
    trusted, untrusted = Lane(), Lane(trusted=False)
    assert (trusted.max_result_bytes, trusted.inherit_env, trusted.kill_grace) == (None, True, 0.05)
    assert (untrusted.max_result_bytes, untrusted.inherit_env) == (16 * MIB, False)
    assert Lane(trusted=False, inherit_env=True, max_result_bytes="1K").max_result_bytes == 1024
