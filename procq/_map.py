"""``ProcQueue.map``: a lazy, bounded map of a function over an iterable, as keyed jobs.

Unlike ``ProcessPoolExecutor.map``, which submits every item before it yields
the first result, this pulls an item from the input only when fewer than
``window`` of its jobs are out (pushed and not yet yielded), and each push
still waits for room in its lane. Memory is bounded by the window, whatever
the input's length, so an endless generator works.

Outputs in order hold the window's head back until it ends (a slow first job
delays the outputs behind it, never the jobs: they run). Unordered, a job's
end is signalled through the core's completion callbacks onto a local queue,
so the iterator sleeps on that queue and never polls.
"""

from __future__ import annotations

import queue
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from procq._errors import JobFailed
from procq._fingerprint import content_key
from procq._values import Cached, Job, PushOutcome

if TYPE_CHECKING:
    from procq._queue import ProcQueue

__all__ = ["map_jobs"]


def map_jobs(
    q: ProcQueue,
    fn: Callable[[Any], Any],
    iterable: Iterable[Any],
    key: Callable[[Any], str] | None,
    lane: str | None,
    ordered: bool,
    return_failures: bool,
) -> Iterator[Any]:
    """Check the arguments now (not at the first ``next``), then iterate lazily."""
    if not callable(fn):
        raise TypeError(f"map(): fn must be callable, got {type(fn).__name__}")
    if key is not None and not callable(key):
        raise TypeError(f"map(): key must be a function of the item or None, got {type(key).__name__}")
    lane_state = q._core.lane_for(Job("map", fn, lane=lane))
    items = iter(iterable)
    window = 2 * lane_state.spec.workers
    if ordered:
        return _ordered(q, fn, items, key, lane, window, return_failures)
    return _unordered(q, fn, items, key, lane, window, return_failures)


def _job(fn: Callable[[Any], Any], item: Any, key: Callable[[Any], str] | None, lane: str | None) -> Job[Any]:
    k = content_key(fn, item) if key is None else key(item)
    return Job(k, fn, (item,), lane=lane)


def _value(outcome: PushOutcome, return_failures: bool) -> Any:
    if isinstance(outcome, Cached):
        return outcome.output
    try:
        return outcome.handle.result()
    except JobFailed as failed:
        if return_failures:
            return failed
        raise


def _ordered(
    q: ProcQueue,
    fn: Callable[[Any], Any],
    items: Iterator[Any],
    key: Callable[[Any], str] | None,
    lane: str | None,
    window: int,
    return_failures: bool,
) -> Iterator[Any]:
    out: deque[PushOutcome] = deque()
    exhausted = False
    while True:
        while not exhausted and len(out) < window:
            try:
                item = next(items)
            except StopIteration:
                exhausted = True
                break
            out.append(q.push(_job(fn, item, key, lane)))
        if not out:
            return
        yield _value(out.popleft(), return_failures)


def _unordered(
    q: ProcQueue,
    fn: Callable[[Any], Any],
    items: Iterator[Any],
    key: Callable[[Any], str] | None,
    lane: str | None,
    window: int,
    return_failures: bool,
) -> Iterator[Any]:
    ended: queue.SimpleQueue[PushOutcome] = queue.SimpleQueue()
    out = 0
    exhausted = False
    core = q._core
    while True:
        while not exhausted and out < window:
            try:
                item = next(items)
            except StopIteration:
                exhausted = True
                break
            outcome = q.push(_job(fn, item, key, lane))
            out += 1
            if isinstance(outcome, Cached):
                ended.put(outcome)
            else:
                entry = outcome.handle._entry
                if not core.add_callback(entry, lambda o=outcome: ended.put(o)):  # type: ignore[arg-type,misc]
                    ended.put(outcome)  # already ended
        if not out:
            return
        done = ended.get()
        out -= 1
        yield _value(done, return_failures)
