"""``ProcQueue.map`` and ``ProcQueue.amap``: the two faces of a map, typed.

A mixin of ``ProcQueue`` (the map itself is in ``_api.map`` and ``_api.map_async``).
Their overloads say what a map yields: ``Iterator[T]`` for a function
returning ``T``, and ``T | JobFailed`` items with ``return_failures=True``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast, overload

from procq._model.errors import JobFailed

if TYPE_CHECKING:
    from procq._api.queue import ProcQueue

__all__ = ["MapFace"]

T = TypeVar("T")


class MapFace:
    """``map`` (a lazy iterator) and ``amap`` (its async twin) of ``ProcQueue``."""

    __slots__ = ()

    @overload
    def map(
        self,
        fn: Callable[..., T],
        iterable: Iterable[Any],
        *iterables: Iterable[Any],
        key: Callable[..., str] | None = ...,
        lane: str | None = ...,
        ordered: bool = ...,
        return_failures: Literal[False] = ...,
        chunksize: int = ...,
        keep: bool = ...,
        timeout: float | None = ...,
        progress: Any = ...,
    ) -> Iterator[T]: ...
    @overload
    def map(
        self,
        fn: Callable[..., T],
        iterable: Iterable[Any],
        *iterables: Iterable[Any],
        key: Callable[..., str] | None = ...,
        lane: str | None = ...,
        ordered: bool = ...,
        return_failures: bool,
        chunksize: int = ...,
        keep: bool = ...,
        timeout: float | None = ...,
        progress: Any = ...,
    ) -> Iterator[T | JobFailed]: ...
    def map(
        self,
        fn: Callable[..., T],
        iterable: Iterable[Any],
        *iterables: Iterable[Any],
        key: Callable[..., str] | None = None,
        lane: str | None = None,
        ordered: bool = True,
        return_failures: bool = False,
        chunksize: int = 1,
        keep: bool = False,
        timeout: float | None = None,
        progress: Any = None,
    ) -> Iterator[T | JobFailed]:
        """``fn(item)`` for every item, run as jobs: a lazy iterator over the outputs.

        Several iterables zip as for the built-in ``map``, ``fn(*items)`` and
        ``key(*items)`` (the shortest input ends it). ``timeout`` (seconds from
        this call) raises ``TimeoutError`` where an output is not ready by then.
        ``progress``: a function called with ``(done, total)`` items (``total``
        None for an input without ``len``) as outputs are handed out, or ``True``
        for a tqdm bar (tqdm must be installed).

        Items are pulled from ``iterable`` only as the lane has room (at most
        256 items, and at least two jobs per worker, are out at once), so an
        endless or huge input runs in bounded memory. Each job's key is ``key(item)``,
        or a content hash of ``fn`` and the item (``"map:<fn digest>:<item
        digest>"``): an item whose key is live or kept answers from the queue
        like any push. ``chunksize`` items go to a job together (its key is
        made from theirs), for many small items. By default a key this map
        claimed is forgotten once its output has been handed out, so a long
        map leaves nothing behind; ``keep=True`` keeps them (subject to the
        queue's retention). With ``ordered=True`` outputs come in input order,
        else as jobs end. A failed job raises ``JobFailed`` where its output
        would come (ending the iteration), or with ``return_failures=True`` is
        yielded as the ``JobFailed`` exception itself (once per item of a
        failed chunk).
        """
        from procq._api.map import map_jobs

        q = cast("ProcQueue", self)
        q._here()
        return map_jobs(
            q, fn, (iterable, *iterables), key, lane, ordered, return_failures, chunksize, keep, timeout, progress
        )

    @overload
    def amap(
        self,
        fn: Callable[..., T],
        iterable: Iterable[Any],
        *iterables: Iterable[Any],
        key: Callable[..., str] | None = ...,
        lane: str | None = ...,
        ordered: bool = ...,
        return_failures: Literal[False] = ...,
        chunksize: int = ...,
        keep: bool = ...,
        timeout: float | None = ...,
        progress: Any = ...,
    ) -> AsyncIterator[T]: ...
    @overload
    def amap(
        self,
        fn: Callable[..., T],
        iterable: Iterable[Any],
        *iterables: Iterable[Any],
        key: Callable[..., str] | None = ...,
        lane: str | None = ...,
        ordered: bool = ...,
        return_failures: bool,
        chunksize: int = ...,
        keep: bool = ...,
        timeout: float | None = ...,
        progress: Any = ...,
    ) -> AsyncIterator[T | JobFailed]: ...
    def amap(
        self,
        fn: Callable[..., T],
        iterable: Iterable[Any],
        *iterables: Iterable[Any],
        key: Callable[..., str] | None = None,
        lane: str | None = None,
        ordered: bool = True,
        return_failures: bool = False,
        chunksize: int = 1,
        keep: bool = False,
        timeout: float | None = None,
        progress: Any = None,
    ) -> AsyncIterator[T | JobFailed]:
        """The asyncio form of :meth:`map`: ``async for out in q.amap(fn, items)``.

        The same map (arguments, keys, window, ordering, failures, ``keep``,
        ``timeout``, ``progress``), waiting without blocking the loop. It
        returns an async generator: a map left early (``break``, an exception,
        the consuming task cancelled) cancels the jobs it started and had not
        handed out. For that to happen at once after a ``break``, close it:
        ``async with contextlib.aclosing(q.amap(...)) as outs``; a generator
        merely dropped is closed a moment later by the loop. It must be
        consumed on one event loop, the one it was first iterated on.
        """
        from procq._api.map_async import amap_jobs

        q = cast("ProcQueue", self)
        q._here()
        return amap_jobs(
            q, fn, (iterable, *iterables), key, lane, ordered, return_failures, chunksize, keep, timeout, progress
        )
