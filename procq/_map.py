"""``ProcQueue.map``: a lazy, bounded map of a function over an iterable, as keyed jobs.

Unlike ``ProcessPoolExecutor.map``, which submits every item before it yields
the first result, this pulls items from the input only while fewer than
``window`` of its jobs are out (pushed and not yet yielded), and each push
still waits for room in its lane. The window is bounded, whatever the input's
length, and so is memory: by default each job's key is forgotten once its
output has been handed out (``keep=True`` keeps them, as any push does), so an
endless generator runs in constant memory.

``chunksize`` items go to a job together (``_run_chunk`` runs ``fn`` over
them in the worker), which is what a large map of tiny items needs: one
message per chunk instead of one per item. A chunk is one job with one key
(from the items' keys, or a digest of its items), and fails as one.

Outputs in order hold the window's head back until it ends (a slow first job
delays the outputs behind it, never the jobs: they run). Unordered, a job's
end is signalled through the core's completion callbacks onto a local queue,
so the iterator sleeps on that queue and never polls.
"""

from __future__ import annotations

import contextlib
import hashlib
import queue
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from procq._errors import JobFailed
from procq._fingerprint import content_key, fn_name
from procq._job import Job
from procq._protocol import dumps
from procq._values import Cached, PushOutcome, Queued

if TYPE_CHECKING:
    from procq._queue import ProcQueue

__all__ = ["map_jobs"]

#: At most this many of a map's items are out at once (and at least two jobs per worker).
WINDOW = 256


def _run_chunk(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    """A chunk's job, in the worker."""
    return [fn(item) for item in items]


class _Out:
    """One job of the map that is out: its push's outcome and what it covers."""

    __slots__ = ("chunked", "count", "key", "ours", "outcome")

    def __init__(self, outcome: PushOutcome, job: Job[Any], count: int) -> None:
        self.outcome = outcome
        self.key = job.key
        self.count = count  # items it covers
        self.chunked = job.fn is _run_chunk  # its output is the list of its items' outputs
        self.ours = isinstance(outcome, Queued)  # this map claimed the key


def map_jobs(
    q: ProcQueue,
    fn: Callable[[Any], Any],
    iterable: Iterable[Any],
    key: Callable[[Any], str] | None,
    lane: str | None,
    ordered: bool,
    return_failures: bool,
    chunksize: int = 1,
    keep: bool = False,
) -> Iterator[Any]:
    """Check the arguments now (not at the first ``next``), then iterate lazily."""
    if not callable(fn):
        raise TypeError(f"map(): fn must be callable, got {type(fn).__name__}")
    if key is not None and not callable(key):
        raise TypeError(f"map(): key must be a function of the item or None, got {type(key).__name__}")
    if isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
        raise ValueError(f"map(): chunksize must be an int of at least 1, got {chunksize!r}")
    lane_state = q._core.lane_for(Job("map", fn, lane=lane))
    spec = lane_state.spec
    # In items, not jobs: a map of big chunks keeps as few out as keeps every
    # worker busy (two each), a map of single items enough to feed them in bulk.
    window = max(2 * spec.workers, min(spec.capacity, WINDOW // chunksize))
    jobs = _jobs(fn, iter(iterable), key, lane, chunksize)
    if ordered:
        return _ordered(q, jobs, window, return_failures, keep)
    return _unordered(q, jobs, window, return_failures, keep)


def _jobs(
    fn: Callable[[Any], Any], items: Iterator[Any], key: Callable[[Any], str] | None, lane: str | None, chunksize: int
) -> Iterator[tuple[Job[Any], int]]:
    """The map's jobs, made as they are pulled: ``(job, items it covers)``."""
    if chunksize == 1:
        for item in items:
            yield Job(content_key(fn, item) if key is None else key(item), fn, (item,), lane=lane), 1
        return
    name = fn_name(fn)
    while True:
        chunk = []
        for item in items:
            chunk.append(item)
            if len(chunk) == chunksize:
                break
        if not chunk:
            return
        if key is None:
            digest = hashlib.blake2b(dumps(chunk), digest_size=16).hexdigest()
        else:
            digest = hashlib.blake2b("\0".join(key(item) for item in chunk).encode(), digest_size=16).hexdigest()
        fn_digest = hashlib.blake2b(name.encode(), digest_size=8).hexdigest()
        yield Job(f"map-chunk:{fn_digest}:{len(chunk)}:{digest}", _run_chunk, (fn, chunk), lane=lane), len(chunk)
        if len(chunk) < chunksize:
            return


def _values(q: ProcQueue, out: _Out, return_failures: bool, keep: bool) -> list[Any]:
    """The outputs of one job of the map, in item order (its failure, once per item)."""
    outcome = out.outcome
    try:
        if isinstance(outcome, Cached):
            value = outcome.output
        else:
            try:
                value = outcome.handle.result()
            except JobFailed as failed:
                if not return_failures:
                    raise
                return [failed] * out.count
        return value if out.chunked else [value]
    finally:
        if out.ours and not keep:
            with contextlib.suppress(ValueError):  # pushed again since, and running: not this map's to drop
                q._core.forget(out.key)


def _ordered(
    q: ProcQueue, jobs: Iterator[tuple[Job[Any], int]], window: int, return_failures: bool, keep: bool
) -> Iterator[Any]:
    pending: deque[_Out] = deque()
    exhausted = False
    while True:
        while not exhausted and len(pending) < window:
            try:
                job, count = next(jobs)
            except StopIteration:
                exhausted = True
                break
            pending.append(_Out(q.push(job), job, count))
        if not pending:
            return
        yield from _values(q, pending.popleft(), return_failures, keep)


def _unordered(
    q: ProcQueue, jobs: Iterator[tuple[Job[Any], int]], window: int, return_failures: bool, keep: bool
) -> Iterator[Any]:
    ended: queue.SimpleQueue[_Out] = queue.SimpleQueue()
    out = 0
    exhausted = False
    core = q._core
    while True:
        while not exhausted and out < window:
            try:
                job, count = next(jobs)
            except StopIteration:
                exhausted = True
                break
            one = _Out(q.push(job), job, count)
            out += 1
            outcome = one.outcome
            if isinstance(outcome, Cached):
                ended.put(one)
            else:
                entry = outcome.handle._entry
                if not core.add_callback(entry, lambda one=one: ended.put(one)):  # type: ignore[arg-type,misc]
                    ended.put(one)  # already ended
        if not out:
            return
        done = ended.get()
        out -= 1
        yield from _values(q, done, return_failures, keep)
