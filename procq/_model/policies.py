"""What a job does after it failed, and how long ended keys are kept: Retry and
Retention. Frozen dataclasses, checked when made."""

from __future__ import annotations

import math
from dataclasses import dataclass

from procq._model.values import RETRYABLE_KINDS, FailureKind

__all__ = ["Retention", "Retry"]


@dataclass(frozen=True)
class Retry:
    """Run a failed attempt again, after a growing backoff.

    At most ``attempts`` attempts run in all (the first included). After
    attempt ``n`` fails with a kind in ``on``, attempt ``n + 1`` starts
    ``min(max_backoff, backoff * factor ** (n - 1))`` seconds later, that
    delay scaled by a random factor in ``[1 - jitter, 1 + jitter]``. Between
    attempts the key stays live: ``state()`` is ``Pending(attempt=n + 1)`` and
    a push joins it (``InFlight``). The key becomes ``Failed`` only when an
    attempt fails with a kind not in ``on`` or the last attempt fails; that
    failure says how many attempts ran and why each failed.

    ``on`` takes kinds from ``"error"``, ``"crashed"``, ``"timeout"``,
    ``"memory"`` and ``"protocol"``; a ``"cancelled"`` job is never retried.
    """

    attempts: int = 3
    backoff: float = 0.1
    factor: float = 2.0
    max_backoff: float = 30.0
    jitter: float = 0.2
    on: tuple[FailureKind, ...] = ("crashed", "timeout", "error")

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise TypeError(f"Retry attempts must be an int, got {type(self.attempts).__name__}")
        if self.attempts < 1:
            raise ValueError(f"Retry needs at least 1 attempt, got {self.attempts}")
        for name in ("backoff", "factor", "max_backoff", "jitter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise TypeError(f"Retry {name} must be a finite number, got {value!r}")
            if value < 0:
                raise ValueError(f"Retry {name} must be >= 0, got {value!r}")
        if self.factor < 1:
            raise ValueError(f"Retry factor must be >= 1 (a backoff never shrinks), got {self.factor!r}")
        if self.jitter > 1:
            raise ValueError(f"Retry jitter must be between 0 and 1, got {self.jitter!r}")
        on = self.on
        if isinstance(on, str):
            on = (on,)
        if not isinstance(on, (tuple, list, set, frozenset)):
            raise TypeError(f"Retry on must be a tuple of failure kinds, got {type(on).__name__}")
        for kind in on:
            if kind == "cancelled":
                raise ValueError("Retry on cannot include 'cancelled': a cancelled job is never retried")
            if kind not in RETRYABLE_KINDS:
                known = ", ".join(repr(k) for k in sorted(RETRYABLE_KINDS))
                raise ValueError(f"Retry on: unknown failure kind {kind!r}; the kinds are {known}")
        object.__setattr__(self, "on", tuple(on))

    def delay(self, attempt: int, rand: float) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based), for a
        ``rand`` drawn uniformly from [0, 1)."""
        try:  # (a float power past 1.8e308 overflows: the cap applies)
            base = min(self.max_backoff, self.backoff * float(self.factor) ** (attempt - 1) if self.backoff else 0.0)
        except OverflowError:
            base = self.max_backoff
        return max(0.0, base * (1.0 + self.jitter * (2.0 * rand - 1.0)))


@dataclass(frozen=True)
class Retention:
    """How long a queue keeps keys that ended. The default keeps every key forever.

    - ``ttl``: a completed key is dropped this many seconds after it completed.
    - ``max_completed``: at most this many completed keys are kept; beyond it
      the least recently used are dropped (a push answered ``Cached`` and a
      ``state()`` read count as uses).
    - ``failed_ttl``: a failed key's record (what ``state()`` reports) is
      dropped this many seconds after it failed. A failed key stays retryable
      either way.

    A dropped key is as if never pushed: ``state()`` is ``None`` and the next
    push runs it. Expiry is decided from the times stored with each key
    whenever the key is read, so an expired key is never answered from the
    store; the memory of expired keys is reclaimed as the queue is used.
    """

    ttl: float | None = None
    max_completed: int | None = None
    failed_ttl: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttl", "failed_ttl"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"Retention {name} must be a number of seconds or None, got {type(value).__name__}")
            if math.isnan(value) or value < 0:
                raise ValueError(f"Retention {name} must be None or a number of seconds >= 0, got {value!r}")
        limit = self.max_completed
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int):
                raise TypeError(f"Retention max_completed must be an int or None, got {type(limit).__name__}")
            if limit < 0:
                raise ValueError(f"Retention max_completed must be >= 0, got {limit}")

    @property
    def bounded(self) -> bool:
        return self.ttl is not None or self.max_completed is not None or self.failed_ttl is not None
