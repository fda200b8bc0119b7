"""The public surface: every name in ``procq.__all__`` imports, the error tree, and stats read as
attributes, items and a dict."""

from __future__ import annotations

from typing import Any

import jobs
import pytest
from core_support import WAIT

import procq
import procq._api.queue
from procq import Job, JobFailed, ProcQueue, ProcQueueError, QueueClosed


def test_all_is_sorted_unique_and_importable() -> None:
    names = procq.__all__
    assert names == sorted(names)
    assert len(set(names)) == len(names)
    namespace: dict[str, Any] = {}
    exec("from procq import *", namespace)
    for name in names:
        assert namespace[name] is getattr(procq, name)
    contract = {
        "ProcQueue", "Job", "Lane", "Queued", "Cached", "InFlight", "Pending", "Processing",
        "Completed", "Failed", "Failure", "JobFailed", "JobHandle", "ProcQueueError", "LaneFull",
        "QueueClosed",
    }  # fmt: skip
    assert contract <= set(names)


def test_the_error_tree() -> None:
    assert issubclass(procq.LaneFull, ProcQueueError) and issubclass(procq.LaneFull, TimeoutError)
    assert issubclass(QueueClosed, ProcQueueError)
    assert issubclass(JobFailed, Exception) and not issubclass(JobFailed, ProcQueueError)


def test_stats_read_as_attributes_items_and_a_dict(queue: ProcQueue) -> None:
    assert queue.push_and_wait(Job("s", jobs.square, args=(3,), lane="io"), timeout=WAIT) == 9
    stats = queue.stats()
    assert stats.completed == stats["completed"] == 1
    assert stats.lanes["io"].completed == stats["lanes"]["io"]["completed"] == 1
    assert stats["lanes"]["cpu"]["workers"] == 2
    with pytest.raises(KeyError):
        stats["nothing"]
    as_dict = stats.to_dict()
    assert as_dict["completed"] == 1 and as_dict["lanes"]["io"]["name"] == "io"
    assert as_dict["lanes"]["io"]["workers"] == 1 and as_dict["lanes"]["cpu"]["capacity"] == 1024
