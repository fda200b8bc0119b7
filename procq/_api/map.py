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

Several iterables zip as the built-in ``map`` does (the shortest ends the
map): an item is then the tuple of arguments, ``fn(*item)`` runs and
``key(*item)`` names it. ``timeout`` counts from the call to ``map`` (as in
``Executor.map``): an output not ready by then raises ``TimeoutError``,
which ends the map like any exception. ``progress`` is told, from the
consumer's thread as outputs are handed out, how many items are done and the
total (None when an input has no ``len``); ``True`` draws a tqdm bar.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import reprlib
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from procq._api.outcomes import Cached, PushOutcome, Queued
from procq._model.errors import JobFailed, LaneFull, WrongProcess
from procq._model.job import Job, check_wait
from procq._wire.fingerprint import content_key, fn_name
from procq._wire.protocol import blake2b, dumps

if TYPE_CHECKING:
    from procq._api.queue import ProcQueue

__all__ = ["map_jobs", "prepare"]

#: At most this many of a map's items are out at once (and at least two jobs per worker).
WINDOW = 256
#: Past this many bytes of arguments in shared memory out at once, a map
#: pushes no more than it needs to keep every worker busy (two jobs each):
#: its segments are then given back and written again for later items, at
#: memory speed, instead of hundreds of new ones, each page of which the
#: kernel allocates and zeroes first.
SHARED_AHEAD = 128 << 20
#: A failed item is named by its index and its repr, cut to this many characters.
ITEM_REPR = 80

_repr = reprlib.Repr()  # bounded work on a huge container, too
_repr.maxstring = _repr.maxother = ITEM_REPR
_repr.maxlevel = 3


def _run_chunk(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    """A chunk's job, in the worker."""
    return [fn(item) for item in items]


def _run_star_chunk(fn: Callable[..., Any], items: list[tuple[Any, ...]]) -> list[Any]:
    """A chunk's job of a map over several iterables, in the worker."""
    return [fn(*item) for item in items]


class _Progress:
    """Reports a map's progress: ``report(done, total)``, or a tqdm bar."""

    __slots__ = ("bar", "done", "report", "total")

    def __init__(self, progress: Any, total: int | None) -> None:
        self.done = 0
        self.total = total
        self.bar: Any = None
        self.report: Callable[[int, int | None], object] | None = None
        if progress is True:
            try:
                from tqdm.auto import tqdm  # type: ignore[import-not-found,import-untyped,unused-ignore]
            except ImportError:
                raise ImportError(
                    "map(progress=True) draws a tqdm bar, and tqdm is not installed: "
                    "pip install tqdm, or pass progress=a function of (done, total)"
                ) from None
            self.bar = tqdm(total=total)
        elif callable(progress):
            self.report = progress
        else:
            raise TypeError(
                f"map(): progress must be None, True (a tqdm bar) or a function of (done, total), "
                f"got {type(progress).__name__}"
            )

    def advance(self, count: int) -> None:
        self.done += count
        if self.bar is not None:
            self.bar.update(count)
        elif self.report is not None:
            self.report(self.done, self.total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _total(iterables: tuple[Iterable[Any], ...]) -> int | None:
    """How many items the map has, if every input knows its length."""
    try:
        return min(len(it) for it in iterables)  # type: ignore[arg-type]
    except TypeError:
        return None


class _Out:
    """One job of the map that is out: its push's outcome and what it covers."""

    __slots__ = ("chunked", "count", "first", "items", "key", "ours", "outcome", "shared")

    def __init__(self, outcome: PushOutcome[Any], job: Job[Any], count: int, first: int, star: bool) -> None:
        self.outcome = outcome
        self.key = job.key
        self.count = count  # items it covers
        self.first = first  # the index of its first item in the map's input
        self.chunked = job.fn is _run_chunk or job.fn is _run_star_chunk  # its output: its items' outputs
        # (To name them if it fails. An item of a map over several iterables
        # is the tuple of its arguments: a lone one's job.args.)
        self.items: Sequence[Any] = job.args[1] if self.chunked else ((job.args,) if star else job.args)
        self.ours = isinstance(outcome, Queued)  # this map claimed the key
        # The bytes of its arguments in shared memory (``_wire.shm``), while it is out.
        segment = getattr(getattr(getattr(outcome, "handle", None), "_entry", None), "segment", None)
        self.shared: int = 0 if segment is None else segment.size

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
    error.__cause__ = failed.__cause__  # the job's own exception (or its traceback's text), as on the handle's
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
    fn: Callable[..., Any],
    iterables: tuple[Iterable[Any], ...],
    key: Callable[..., str] | None,
    lane: str | None,
    ordered: bool,
    return_failures: bool,
    chunksize: int = 1,
    keep: bool = False,
    timeout: float | None = None,
    progress: Any = None,
) -> Iterator[Any]:
    """Check the arguments now (not at the first ``next``), then iterate lazily."""
    run, jobs = prepare(q, fn, iterables, key, lane, return_failures, chunksize, keep, timeout, progress)
    if ordered:
        return _ordered(run, jobs)
    return _unordered(run, jobs)


def prepare(
    q: ProcQueue,
    fn: Callable[..., Any],
    iterables: tuple[Iterable[Any], ...],
    key: Callable[..., str] | None,
    lane: str | None,
    return_failures: bool,
    chunksize: int,
    keep: bool,
    timeout: float | None,
    progress: Any,
) -> tuple[_Run, Iterator[tuple[Job[Any], int]]]:
    """A map's arguments, checked, as its run and its lazy jobs (for ``map`` and ``amap``)."""
    if not callable(fn):
        raise TypeError(f"map(): fn must be callable, got {type(fn).__name__}")
    if not iterables:
        raise TypeError("map(): needs at least one iterable")
    if key is not None and not callable(key):
        raise TypeError(f"map(): key must be a function of the item or None, got {type(key).__name__}")
    if isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
        raise ValueError(f"map(): chunksize must be an int of at least 1, got {chunksize!r}")
    timeout = check_wait(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    lane_state = q._core.lane_for(Job("map", fn, lane=lane))
    spec = lane_state.spec
    # In items, not jobs: a map of big chunks keeps as few out as keeps every
    # worker busy (two each), a map of single items enough to feed them in bulk.
    window = max(2 * spec.workers, min(spec.capacity, WINDOW // chunksize))
    least = min(window, 2 * spec.workers)
    star = len(iterables) > 1
    items = zip(*iterables, strict=False) if star else iter(iterables[0])
    report = None if progress is None else _Progress(progress, _total(iterables))
    jobs = _jobs(fn, items, key, lane, chunksize, star)
    return _Run(q, (least, window), return_failures, keep, star, deadline, timeout, report), jobs


class _Run:
    """What one map's iteration works with: its queue and options."""

    __slots__ = ("deadline", "keep", "least", "progress", "q", "return_failures", "shared", "star", "timeout", "window")

    def __init__(
        self,
        q: ProcQueue,
        window: tuple[int, int],
        return_failures: bool,
        keep: bool,
        star: bool,
        deadline: float | None,
        timeout: float | None,
        progress: _Progress | None,
    ) -> None:
        self.q = q
        # At most ``window`` jobs out; past ``SHARED_AHEAD`` bytes in shared memory, ``least``.
        self.least, self.window = window
        self.shared = 0  # bytes of the outs' arguments in shared memory
        self.return_failures = return_failures
        self.keep = keep
        self.star = star
        self.deadline = deadline  # on the monotonic clock; None: no timeout
        self.timeout = timeout
        self.progress = progress

    def left(self) -> float | None:
        """Seconds until the deadline, never below 0 (None: no deadline)."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def timed_out(self) -> TimeoutError:
        return TimeoutError(f"map(): not every output was ready within its timeout of {self.timeout}s")

    def room(self, out: int) -> bool:
        """May one more job go out, with ``out`` out now?"""
        return out < self.window and (out < self.least or self.shared < SHARED_AHEAD)

    def push(self, job: Job[Any], count: int, first: int) -> _Out:
        try:
            return self.went(_Out(self.q.push(job, timeout=self.left()), job, count, first, self.star))
        except LaneFull:
            if self.deadline is None:
                raise
            raise self.timed_out() from None

    def went(self, one: _Out) -> _Out:
        """``one`` is out (pushed, its outputs not handed out yet)."""
        self.shared += one.shared
        return one

    def back(self, one: _Out, values: int) -> None:
        """``one`` is in: its ``values`` outputs were handed out."""
        self.shared -= one.shared
        self.handed_out(values)

    def handed_out(self, count: int) -> None:
        if self.progress is not None:
            self.progress.advance(count)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()


def _jobs(
    fn: Callable[..., Any],
    items: Iterator[Any],
    key: Callable[..., str] | None,
    lane: str | None,
    chunksize: int,
    star: bool,
) -> Iterator[tuple[Job[Any], int]]:
    """The map's jobs, made as they are pulled: ``(job, items it covers)``."""
    if chunksize == 1:
        for item in items:
            args = item if star else (item,)
            name = content_key(fn, item) if key is None else key(*args)
            yield Job(name, fn, args, lane=lane), 1
        return
    name = fn_name(fn)
    run_chunk = _run_star_chunk if star else _run_chunk
    while True:
        chunk = list(itertools.islice(items, chunksize))
        if not chunk:
            return
        if key is None:
            digest = blake2b(dumps(chunk), digest_size=16).hexdigest()
        else:
            names = (key(*item) if star else key(item) for item in chunk)
            digest = blake2b("\0".join(names).encode(), digest_size=16).hexdigest()
        fn_digest = blake2b(name.encode(), digest_size=8).hexdigest()
        star_mark = "*" if star else ""
        yield (
            Job(f"map-chunk{star_mark}:{fn_digest}:{len(chunk)}:{digest}", run_chunk, (fn, chunk), lane=lane),
            len(chunk),
        )
        if len(chunk) < chunksize:
            return


def _values(run: _Run, out: _Out) -> list[Any]:
    """The outputs of one job of the map, in item order (its failure, once per item)."""
    outcome = out.outcome
    try:
        if isinstance(outcome, Cached):
            value = outcome.output
        else:
            try:
                value = outcome.handle.result(timeout=run.left())
            except TimeoutError:
                raise run.timed_out() from None
            except JobFailed as failed:
                if not run.return_failures:
                    raise out.failed(failed) from failed.__cause__
                return out.failed_each(failed)
        return value if out.chunked else [value]
    finally:
        if out.ours and not run.keep:
            with contextlib.suppress(ValueError):  # pushed again since, and running: not this map's to drop
                run.q._core.forget(out.key)


def _ordered(run: _Run, jobs: Iterator[tuple[Job[Any], int]]) -> Iterator[Any]:
    consumer = threading.get_ident()
    pending: deque[_Out] = deque()
    pulled = 0  # items pulled from the input so far
    exhausted = False
    try:
        while True:
            while not exhausted and run.room(len(pending)):
                try:
                    job, count = next(jobs)
                except StopIteration:
                    exhausted = True
                    break
                pending.append(run.push(job, count, pulled))
                pulled += count
            if not pending:
                return
            values = _values(run, pending[0])
            one = pending.popleft()
            yield from values
            run.back(one, len(values))
    finally:
        run.close()
        _leave(run.q, pending, run.keep, consumer)


def _unordered(run: _Run, jobs: Iterator[tuple[Job[Any], int]]) -> Iterator[Any]:
    consumer = threading.get_ident()
    ended: queue.SimpleQueue[_Out] = queue.SimpleQueue()
    out: set[_Out] = set()  # pushed, outputs not handed out yet
    pulled = 0
    exhausted = False
    core = run.q._core
    try:
        while True:
            while not exhausted and run.room(len(out)):
                try:
                    job, count = next(jobs)
                except StopIteration:
                    exhausted = True
                    break
                one = run.push(job, count, pulled)
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
            try:
                done = ended.get(timeout=run.left())
            except queue.Empty:
                raise run.timed_out() from None
            out.discard(done)
            values = _values(run, done)
            yield from values
            run.back(done, len(values))
    finally:
        run.close()
        _leave(run.q, sorted(out, key=lambda one: one.first), run.keep, consumer)


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
