"""A lane's decode thread: where job outcomes that the I/O thread must not
decode itself are decoded (``_protocol.Undecoded``).

Unpickling a trusted lane's result or exception may run code of the job's
classes (``__reduce__``, ``__setstate__``), which may raise anything
(``SystemExit`` included), block or take long; decoding a large untrusted
JSON result takes long too. On the I/O thread either would stop or stall
every lane. So each lane that needs one gets a thread of its own, started
the first time, that takes the lane's undecoded outcomes in order, decodes
each with no lock held, and hands the outcome to ``Core.decoded``. Whatever
decoding raises fails that job alone (``Undecoded.decode`` never raises).
Only the lane's own later decodes wait behind a slow one: its worker takes
its next jobs meanwhile, and other lanes never notice.

A job whose outcome waits here stays Processing. ``q.cancel`` and closing
without waiting end it at once, as cancelled; a decode already running is
left to finish, and its outcome is dropped. The thread is a daemon: a decode
that never returns holds no lock, no worker and no queue's close.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING

from procq._protocol import Undecoded
from procq._values import Failed, Failure

if TYPE_CHECKING:
    from procq._core import Core
    from procq._entries import Entry

__all__ = ["Decoder"]


class Decoder:
    """One lane's decode thread and the outcomes it has yet to decode, in order."""

    def __init__(self, core: Core, name: str) -> None:
        self._core = core
        self._waiting: deque[tuple[Entry, Undecoded]] = deque()
        self._cond = threading.Condition(threading.Lock())  # guards _waiting and _closed; never Core.lock
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, items: list[tuple[Entry, Undecoded]]) -> None:
        """Decode these (from the I/O thread)."""
        with self._cond:
            self._waiting.extend(items)
            self._cond.notify()

    def close(self) -> None:
        """Decode nothing more; a decode running now ends on its own."""
        with self._cond:
            self._closed = True
            self._waiting.clear()
            self._cond.notify()

    def _run(self) -> None:
        core, waiting, cond = self._core, self._waiting, self._cond
        while True:
            with cond:
                while not waiting and not self._closed:
                    cond.wait()
                if self._closed:
                    return
                entry, undecoded = waiting.popleft()
            if not core.decoding(entry):
                continue  # cancelled meanwhile: its outcome is not needed
            try:
                outcome = undecoded.decode()
            except BaseException as exc:  # pragma: no cover - decode() catches what decoding raises
                outcome = Failed(Failure("error", f"the job's outcome could not be decoded: {type(exc).__name__}"))
            del undecoded
            core.decoded(entry, outcome)
            del entry, outcome  # the job's objects are the records' now, not this frame's
