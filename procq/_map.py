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

A map that ends before its input is done (its consumer broke out, raised,
closed or dropped the iterator, or a failed item ended it) cancels the jobs it
claimed whose outputs it had not handed out, the latest first (those most
likely still waiting, so none of them starts as an earlier one is killed),
waits for them to end and, unless ``keep``, forgets their keys. A key it only
joined (``InFlight`` of someone else's claim, or ``Cached``) is not its to
cancel. It runs in the generator's ``finally``, which Python runs on
``close()``, on an exception thrown in, and when the generator is dropped;
only in the thread that consumed the map does it wait (a generator collected
on another thread, say the supervisor's, must not block it).

A failed item's ``JobFailed`` says which item it was: its index in the input
and a repr cut to ``ITEM_REPR`` characters (for a chunk, the items' range).
"""

from __future__ import annotations

import contextlib
import hashlib
import queue
import reprlib
import threading
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from procq._errors import JobFailed, WrongProcess
from procq._fingerprint import content_key, fn_name
from procq._job import Job
from procq._protocol import dumps
from procq._values import Cached, PushOutcome, Queued

if TYPE_CHECKING:
    from procq._queue import ProcQueue

__all__ = ["map_jobs"]

#: At most this many of a map's items are out at once (and at least two jobs per worker).
WINDOW = 256
#: A failed item is named by its index and its repr, cut to this many characters.
ITEM_REPR = 80

_repr = reprlib.Repr()  # bounded work on a huge container, too
_repr.maxstring = _repr.maxother = ITEM_REPR
_repr.maxlevel = 3


def _run_chunk(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    """A chunk's job, in the worker."""
    return [fn(item) for item in items]


class _Out:
    """One job of the map that is out: its push's outcome and what it covers."""

    __slots__ = ("chunked", "count", "first", "items", "key", "ours", "outcome")

    def __init__(self, outcome: PushOutcome, job: Job[Any], count: int, first: int) -> None:
        self.outcome = outcome
        self.key = job.key
        self.count = count  # items it covers
        self.first = first  # the index of its first item in the map's input
        self.chunked = job.fn is _run_chunk  # its output is the list of its items' outputs
        self.items: Sequence[Any] = job.args[1] if self.chunked else job.args  # (to name them if it fails)
        self.ours = isinstance(outcome, Queued)  # this map claimed the key

    def failed(self, failed: JobFailed) -> JobFailed:
        """``failed``, saying which of the map's items the job ran."""
        first, items = self.first, self.items
        if self.chunked:
            where = f"items {first}-{first + len(items) - 1} (a chunk; item {first} is {_short(items[0])})"
        else:
            where = f"item {first} ({_short(items[0])})"
        return _restate(failed, where)

    def failed_each(self, failed: JobFailed) -> list[JobFailed]:
        """``failed`` once per item the job ran, each saying which item it is."""
        if not self.chunked:
            return [self.failed(failed)]
        first, last = self.first, self.first + len(self.items) - 1
        return [
            _restate(failed, f"item {first + i} ({_short(item)}), in the chunk of items {first}-{last}")
            for i, item in enumerate(self.items)
        ]


def _restate(failed: JobFailed, where: str) -> JobFailed:
    error = JobFailed(failed.key, failed.failure, where)
    error.__cause__ = failed.__cause__  # the job's own exception, as on the handle's
    return error


def _short(item: Any) -> str:
    """A repr of ``item`` of at most ``ITEM_REPR`` characters; never raises."""
    try:
        text = _repr.repr(item)
    except Exception:
        return f"<{type(item).__name__} whose repr failed>"
    return text if len(text) <= ITEM_REPR else text[: ITEM_REPR - 3] + "..."


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
                    raise out.failed(failed) from failed.__cause__
                return out.failed_each(failed)
        return value if out.chunked else [value]
    finally:
        if out.ours and not keep:
            with contextlib.suppress(ValueError):  # pushed again since, and running: not this map's to drop
                q._core.forget(out.key)


def _ordered(
    q: ProcQueue, jobs: Iterator[tuple[Job[Any], int]], window: int, return_failures: bool, keep: bool
) -> Iterator[Any]:
    consumer = threading.get_ident()
    pending: deque[_Out] = deque()
    pulled = 0  # items pulled from the input so far
    exhausted = False
    try:
        while True:
            while not exhausted and len(pending) < window:
                try:
                    job, count = next(jobs)
                except StopIteration:
                    exhausted = True
                    break
                pending.append(_Out(q.push(job), job, count, pulled))
                pulled += count
            if not pending:
                return
            yield from _values(q, pending.popleft(), return_failures, keep)
    finally:
        _leave(q, pending, keep, consumer)


def _unordered(
    q: ProcQueue, jobs: Iterator[tuple[Job[Any], int]], window: int, return_failures: bool, keep: bool
) -> Iterator[Any]:
    consumer = threading.get_ident()
    ended: queue.SimpleQueue[_Out] = queue.SimpleQueue()
    out: set[_Out] = set()  # pushed, outputs not handed out yet
    pulled = 0
    exhausted = False
    core = q._core
    try:
        while True:
            while not exhausted and len(out) < window:
                try:
                    job, count = next(jobs)
                except StopIteration:
                    exhausted = True
                    break
                one = _Out(q.push(job), job, count, pulled)
                pulled += count
                out.add(one)
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
            out.discard(done)
            yield from _values(q, done, return_failures, keep)
    finally:
        _leave(q, sorted(out, key=lambda one: one.first), keep, consumer)


def _leave(q: ProcQueue, outs: Collection[_Out], keep: bool, consumer: int) -> None:
    """The map ended with ``outs`` still out: cancel the ones it claimed (see
    the module docstring), wait for them to end and, unless ``keep``, forget them."""
    ours = [one for one in outs if one.ours]
    if not ours:
        return
    try:
        q._here()
    except WrongProcess:  # a forked child's copy of the map: the jobs are the parent's
        return
    handles = [one.outcome.handle for one in ours]  # type: ignore[union-attr]
    for handle in reversed(handles):
        # Only while the claim is still live: a key that ended may since have
        # been claimed by someone else, whose job is not this map's to cancel.
        if not handle.done():
            q.cancel(handle.key)
    if threading.get_ident() != consumer:
        return
    for handle in handles:
        with contextlib.suppress(JobFailed):
            handle.result()
    if not keep:
        for handle in handles:
            with contextlib.suppress(ValueError):  # pushed again since, and running: not this map's to drop
                q._core.forget(handle.key)
