"""``Job.of``: a job whose arguments mypy checks against its function.

``Job(key, fn, args, kwargs)`` takes the arguments as a tuple and a dict, so
no type checker can match them to ``fn``'s parameters. ``Job.of(key, fn,
**options)`` returns a ``JobOf``, typed with ``fn``'s ``ParamSpec``; calling
it with ``fn``'s arguments makes the ``Job``::

    job = Job.of("resize:42", resize, lane="cpu")(image_id=42, width=640)
    # Job[Image]; resize(image_id=42, width="640") would be a mypy error

The two steps are what keeps both kinds of keyword apart: the job's options
(``lane``, ``timeout``, ``retry`` ...) go to ``Job.of``, and every keyword of
the call goes to ``fn``, so a function with a parameter named ``lane`` or
``timeout`` is still checked, and still receives it. (A one-call form, with
the options and ``fn``'s keywords in one ``**kwargs``, cannot be typed that
way: ``ParamSpec``'s ``**kwargs`` takes no neighbours.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

if TYPE_CHECKING:
    from procq._job import Job

__all__ = ["JobOf"]

P = ParamSpec("P")
T = TypeVar("T")


class JobOf(Generic[P, T]):
    """A key, a function and a job's options, waiting for the function's
    arguments: ``builder(*args, **kwargs)`` makes the ``Job[T]``. It may be
    called any number of times; each call makes a job with the same key (so
    give each a key of its own, unless one piece of work is meant)."""

    __slots__ = ("fn", "key", "options")

    def __init__(self, key: str, fn: Callable[P, T], options: dict[str, Any]) -> None:
        from procq._job import Job

        Job(key, fn, **options)  # check the key, fn and options now, where the mistake is
        self.key = key
        self.fn = fn
        self.options = options

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Job[T]:
        from procq._job import Job

        return Job(self.key, self.fn, args, kwargs or None, **self.options)

    def __repr__(self) -> str:
        return f"<JobOf key={self.key!r} fn={getattr(self.fn, '__qualname__', self.fn)!r}>"
