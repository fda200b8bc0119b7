"""A lane's decode thread: where what the I/O thread must not decode itself
is decoded: trusted jobs' outcomes (``_wire.protocol.Undecoded``) and untrusted
jobs' large messages (``_wire.protocol.DecodeLater``).

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

A trusted job whose outcome waits here stays Processing while its worker
takes its next jobs. ``q.cancel`` and closing without waiting end it at
once, as cancelled; a decode already running is left to finish, and its
outcome is dropped. An untrusted job's large message is only decoded here:
the decoded message goes back to the I/O thread, which checks it, in order
with what that worker sent after it, as if it had decoded it itself. The
thread is a daemon: a decode that never returns holds no lock, no worker and
no queue's close.
"""

from __future__ import annotations

import threading
import traceback
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from procq._model.values import Failed, Failure
from procq._wire.protocol import Undecoded

if TYPE_CHECKING:
    from procq._core.core import Core
    from procq._core.entries import Entry, LaneState, WorkerSlot


class Decoders:
    """A queue's decode threads, one per lane that needed one, and what they
    hand back to the I/O thread (``decoded``: a channel's messages decoded for
    it, put from any thread, each put waking the I/O thread)."""

    def __init__(self, core: Core, name: str, wake: Callable[[], None]) -> None:
        self._core = core
        self._name = name
        self._wake = wake
        self._lanes: dict[str, Decoder] = {}
        self.decoded: deque[tuple[WorkerSlot, Any]] = deque()  # (a deque's append and popleft are atomic)

    def lane(self, lane: LaneState) -> Decoder:
        """The lane's decode thread, started the first time."""
        decoder = self._lanes.get(lane.name)
        if decoder is None:
            decoder = self._lanes[lane.name] = Decoder(self._core, f"procq-decode-{self._name}-{lane.name}")
        return decoder

    def message(self, worker: WorkerSlot, decode: Callable[[], Any]) -> None:
        """Decode a message of ``worker``'s on its lane's thread, then hand it back in ``decoded``."""
        self.lane(worker.lane).message(decode, partial(self._put, worker))

    def _put(self, worker: WorkerSlot, decoded: Any) -> None:
        self.decoded.append((worker, decoded))
        self._wake()

    def close(self) -> None:
        for decoder in self._lanes.values():
            decoder.close()  # (not joined: a decode may never return)


__all__ = ["Decoder", "Decoders"]


class Decoder:
    """One lane's decode thread and what it has yet to decode, in order."""

    def __init__(self, core: Core, name: str) -> None:
        self._core = core
        self._tasks: deque[Callable[[], None]] = deque()
        self._cond = threading.Condition(threading.Lock())  # guards _tasks and _closed; never Core.lock
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def outcomes(self, items: list[tuple[Entry, Undecoded]]) -> None:
        """Decode these jobs' outcomes and settle the jobs (from the I/O thread)."""
        self._put([partial(self._settle, entry, undecoded) for entry, undecoded in items])

    def message(self, decode: Callable[[], Any], done: Callable[[Any], None]) -> None:
        """Run ``decode`` (a ``DecodeLater``'s: it never raises) and give ``done`` what it returns."""
        self._put([partial(_then, decode, done)])

    def close(self) -> None:
        """Decode nothing more; a decode running now ends on its own."""
        with self._cond:
            self._closed = True
            self._tasks.clear()
            self._cond.notify()

    def _put(self, tasks: list[Callable[[], None]]) -> None:
        with self._cond:
            self._tasks.extend(tasks)
            self._cond.notify()

    def _run(self) -> None:
        tasks, cond = self._tasks, self._cond
        while True:
            with cond:
                while not tasks and not self._closed:
                    cond.wait()
                if self._closed:
                    return
                task = tasks.popleft()
            try:
                task()
            except BaseException:  # pragma: no cover - every task catches what decoding raises
                traceback.print_exc()
            del task  # the job's objects are the records' now, not this frame's

    def _settle(self, entry: Entry, undecoded: Undecoded) -> None:
        core = self._core
        if not core.decoding(entry):
            return  # cancelled meanwhile: its outcome is not needed
        try:
            outcome = undecoded.decode()
        except BaseException as exc:  # pragma: no cover - decode() catches what decoding raises
            outcome = Failed(Failure("error", f"the job's outcome could not be decoded: {type(exc).__name__}"))
        del undecoded
        core.decoded(entry, outcome)


def _then(decode: Callable[[], Any], done: Callable[[Any], None]) -> None:
    done(decode())
