"""What a push answers: ``Queued``, ``InFlight`` (both carry the job's handle)
or ``Cached`` (the stored output). Frozen dataclasses, matched with ``match``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from procq._api.handle import JobHandle

__all__ = ["Cached", "InFlight", "PushOutcome", "Queued"]

T = TypeVar("T")


@dataclass(frozen=True, init=False)
class Queued(Generic[T]):
    """The key was free (new, or failed before): this push claimed it and queued the job."""

    handle: JobHandle[T]

    def __init__(self, handle: JobHandle[T]) -> None:
        self.__dict__["handle"] = handle  # (made at every fresh push: kept cheap)


@dataclass(frozen=True)
class InFlight(Generic[T]):
    """The key is pending or running: this push joined that job instead of starting another."""

    handle: JobHandle[T]


@dataclass(frozen=True, init=False)
class Cached(Generic[T]):
    """The key completed before: here is its stored output; nothing ran."""

    output: T

    def __init__(self, output: T) -> None:
        self.__dict__["output"] = output  # (made at every cached push: kept cheap)


#: What a push answers, generic in the job's output: ``PushOutcome[int]`` for a
#: ``Job[int]``. (A generic alias: a bare ``PushOutcome`` means ``PushOutcome[Any]``.)
PushOutcome = Queued[T] | InFlight[T] | Cached[T]
