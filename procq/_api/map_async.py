"""``ProcQueue.amap``: ``q.map`` for asyncio, an async iterator over the outputs.

The same map as ``_api.map`` (its arguments are checked and its jobs made by
``_api.map.prepare``): items are pulled only while fewer than the window's are
out, each push waits for room in its lane (``apush``: without blocking the
loop), outputs come in input order or as jobs end, and by default a key the
map claimed is forgotten once its output has been handed out.

Nothing here blocks the loop: a push waits for room in a ``TaskRoom``, an
output is awaited on its handle, and an unordered map hears of each job's end
through the core's completion callback, which (from whichever thread ended
the job) puts it on an ``asyncio.Queue`` through ``call_soon_threadsafe``.

A map that ends early cancels the jobs it claimed and had not handed out, the
latest first, awaits their end and, unless ``keep``, forgets their keys, as
``_api.map._leave`` does. It runs in the async generator's ``finally``: on
``aclose()`` (``contextlib.aclosing``, or ``async with`` on what ``amap``
returns), when the consumer's task is cancelled while it awaits the next
output (the cancellation is raised inside the generator, which cleans up and
lets it go on), on an exception, or, for an iterator merely dropped after a
``break``, when the loop's async-generator hook closes it soon after.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from procq._api.map import _Out, _Run, prepare
from procq._api.outcomes import Cached
from procq._model.errors import JobFailed, LaneFull, WrongProcess
from procq._model.job import Job

if TYPE_CHECKING:
    from procq._api.handle import JobHandle
    from procq._api.queue import ProcQueue

__all__ = ["amap_jobs"]


def amap_jobs(
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
) -> AsyncIterator[Any]:
    """Check the arguments now (not at the first ``__anext__``), then iterate lazily."""
    run, jobs = prepare(q, fn, iterables, key, lane, return_failures, chunksize, keep, timeout, progress)
    if ordered:
        return _ordered(run, jobs)
    return _unordered(run, jobs)


async def _push(run: _Run, job: Job[Any], count: int, first: int) -> _Out:
    try:
        return run.went(_Out(await run.q.apush(job, timeout=run.left()), job, count, first, run.star))
    except LaneFull:
        if run.deadline is None:
            raise
        raise run.timed_out() from None


async def _output(handle: JobHandle[Any]) -> Any:
    return await handle


async def _values(run: _Run, out: _Out) -> list[Any]:
    """The outputs of one job of the map, in item order (its failure, once per item)."""
    outcome = out.outcome
    try:
        if isinstance(outcome, Cached):
            value = outcome.output
        else:
            try:
                if run.deadline is None:
                    value = await outcome.handle
                else:
                    value = await asyncio.wait_for(_output(outcome.handle), run.left())
            except asyncio.TimeoutError:
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


async def _ordered(run: _Run, jobs: Iterator[tuple[Job[Any], int]]) -> AsyncIterator[Any]:
    pending: deque[_Out] = deque()
    pulled = 0
    exhausted = False
    try:
        while True:
            while not exhausted and run.room(len(pending)):
                try:
                    job, count = next(jobs)
                except StopIteration:
                    exhausted = True
                    break
                pending.append(await _push(run, job, count, pulled))
                pulled += count
            if not pending:
                return
            values = await _values(run, pending[0])
            one = pending.popleft()
            for value in values:
                yield value
            run.back(one, len(values))
    finally:
        run.close()
        await _leave(run.q, pending, run.keep)


async def _unordered(run: _Run, jobs: Iterator[tuple[Job[Any], int]]) -> AsyncIterator[Any]:
    loop = asyncio.get_running_loop()
    ended: asyncio.Queue[_Out] = asyncio.Queue()
    out: set[_Out] = set()
    pulled = 0
    exhausted = False
    core = run.q._core

    def on_end(one: _Out) -> Callable[[], None]:
        def ended_now() -> None:  # in whichever thread ended the job
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is left to tell
                loop.call_soon_threadsafe(ended.put_nowait, one)

        return ended_now

    try:
        while True:
            while not exhausted and run.room(len(out)):
                try:
                    job, count = next(jobs)
                except StopIteration:
                    exhausted = True
                    break
                one = await _push(run, job, count, pulled)
                pulled += count
                out.add(one)
                outcome = one.outcome
                if isinstance(outcome, Cached):
                    ended.put_nowait(one)
                elif not core.add_callback(outcome.handle._entry, on_end(one)):  # type: ignore[arg-type]
                    ended.put_nowait(one)  # already ended
            if not out:
                return
            try:
                done = await asyncio.wait_for(ended.get(), run.left())
            except asyncio.TimeoutError:
                raise run.timed_out() from None
            out.discard(done)
            values = await _values(run, done)
            for value in values:
                yield value
            run.back(done, len(values))
    finally:
        run.close()
        await _leave(run.q, sorted(out, key=lambda one: one.first), run.keep)


async def _leave(q: ProcQueue, outs: Collection[_Out], keep: bool) -> None:
    """The map ended with ``outs`` still out: cancel the ones it claimed, the
    latest first, await their end and, unless ``keep``, forget them."""
    ours = [one for one in outs if one.ours]
    if not ours:
        return
    try:
        q._here()
    except WrongProcess:
        return
    handles = [one.outcome.handle for one in ours]  # type: ignore[union-attr]
    for handle in reversed(handles):
        if not handle.done():  # a key that ended may be someone else's claim by now
            q.cancel(handle.key)
    for handle in handles:
        with contextlib.suppress(JobFailed):
            await handle
    if not keep:
        for handle in handles:
            with contextlib.suppress(ValueError):
                q._core.forget(handle.key)
