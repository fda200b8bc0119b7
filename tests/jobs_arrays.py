"""Jobs of the shared-memory tests (tests/test_shared_memory*.py): large
arguments and results, and what a worker can tell of how they arrived."""

from __future__ import annotations

import os
import pickle
import signal
from typing import Any

import jobs
import numpy as np

import procq._wire.shm
import procq._wire.shm_results
from procq._wire.plain import mapped_trailer
from procq._wire.shm_results import MappedFrame, ResultSegments


def mapped_ranges(pid: int | str = "self") -> list[tuple[int, int]]:
    """The address ranges of ``pid`` that map a segment of procq's."""
    ranges = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            if "/dev/shm/procq-" in line:
                start, end = line.split()[0].split("-")
                ranges.append((int(start, 16), int(end, 16)))
    return ranges


def in_segment(array: Any) -> bool:
    """Does ``array``'s memory lie in a mapped segment of procq's (it arrived without a copy)?"""
    address = np.asarray(array).__array_interface__["data"][0]
    return any(start <= address < end for start, end in mapped_ranges())


def total(array: Any) -> float:
    return float(np.asarray(array).sum())


def how_it_came(array: Any) -> tuple[float, bool, bool]:
    """Its sum, whether it is a view of a segment, whether it is writable."""
    return float(array.sum()), in_segment(array), bool(array.flags.writeable)


def add_one_in_place(array: Any) -> Any:
    array += 1
    return array


def times_two(array: Any) -> Any:
    return array * 2


def zeros(n: int) -> Any:
    return np.zeros(n)


_kept: list[Any] = []


def keep(array: Any) -> int:
    """Keep the argument in the worker after the job (as a cache would)."""
    _kept.append(array)
    return len(array)


def kept_total() -> float:
    return float(_kept[0].sum())


def drop_kept() -> None:
    _kept.clear()


def hold(array: Any, started: str, go: str) -> float:
    """Hold a large argument until the test lets it go."""
    jobs.signal_and_wait(started, go)
    return float(array.sum())


def result_after_wait(n: int, started: str, go: str) -> Any:
    jobs.signal_and_wait(started, go)
    return np.ones(n)


def write_result_segment_and_die(supervisor: int, n: int) -> None:
    """Write a result's segment as a worker does, then die before sending it."""
    frame = MappedFrame(0, b"", [pickle.PickleBuffer(np.ones(n))], ResultSegments(f"procq-{supervisor}-"), bytes)
    frame.write(mapped_trailer)
    os.kill(os.getpid(), signal.SIGKILL)


def peek_segment(name: str) -> dict[str, Any]:
    """(A sandboxed job) what it can see of procq's segments, and of segment ``name``."""
    listed = sorted(n for n in os.listdir("/dev/shm") if n.startswith("procq-"))
    try:
        with open(os.path.join("/dev/shm", name), "rb") as f:
            f.read(1)
        opened = "opened"
    except OSError as exc:
        opened = type(exc).__name__
    return {"listed": listed, "open": opened}


def ones_with_no_room(n: int) -> Any:
    """A large result from a worker that finds no room for segments (its
    SHM_DIR gone, as a full /dev/shm refuses a write): set back by ``room``."""
    procq._wire.shm.SHM_DIR = "/nonexistent-procq-test"
    return np.ones(n)


def room() -> None:
    procq._wire.shm.SHM_DIR = "/dev/shm"


def argument_segments(array: Any, prefix: str) -> int:
    """How many argument segments of the supervisor whose names start with
    ``prefix`` exist as this job runs (its own included)."""
    return sum(name.startswith(prefix + "a") for name in os.listdir("/dev/shm"))


def full(n: int, value: float) -> Any:
    return np.full(n, value)


def keep_no_results(n: int) -> Any:
    """A large result from a worker that keeps none of its result segments
    (as one larger than it keeps is not): set back by ``keep_results``."""
    procq._wire.shm_results.KEEP_RESULT_BYTES = 0
    return np.ones(n)


def keep_results() -> None:
    procq._wire.shm_results.KEEP_RESULT_BYTES = 1 << 30


def result_segments_mapped() -> int:
    """How many result segments this worker maps (its kept ones, once written again)."""
    return sum(1 for line in open("/proc/self/maps") if "/dev/shm/procq-" in line and "-w" in line.rsplit("/", 1)[1])


def read_then_linger(array: Any, touch_all: bool, seconds: float) -> str:
    """Read all of a large argument (or its first value only), then stay
    running up to ``seconds`` for the supervisor's memory watch to see it."""
    import time

    float(array.sum()) if touch_all else float(array[0])
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)
    return "lingered"


def trim_after(ms: int) -> None:
    """(In a worker) how long it stays idle before it lets go of its kept result segments."""
    import procq._worker.trusted

    procq._worker.trusted._TRIM_AFTER_MS = ms
