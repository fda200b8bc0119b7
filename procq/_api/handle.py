"""JobHandle: a waiter's view of one job, for threads and for asyncio tasks alike."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from procq._core.entries import Entry, Face, Held
from procq._model.errors import JobFailed, _RemoteTraceback
from procq._model.job import check_wait
from procq._model.values import Completed, State

if TYPE_CHECKING:
    import asyncio
    from concurrent.futures import Future

    from procq._api.queue import ProcQueue
    from procq._core.core import Core
    from procq._core.entries import Ended
    from procq._model.network import Refused

__all__ = ["JobHandle"]

T = TypeVar("T")


class JobHandle(Generic[T]):
    """A handle on one job: wait for it, check on it, await it.

    Any number of handles may refer to one job (every push that joined it gets
    one); they all see the same outcome. A handle refers to the job it was
    given for, not to whatever later runs under the same key.

    It reads like a ``concurrent.futures.Future``: ``result()``,
    ``exception()``, ``done()``, ``add_done_callback()``, ``cancel()``;
    ``future()`` gives a real ``Future`` that mirrors it (for ``wait``,
    ``as_completed``, ``asyncio.wrap_future``), and ``procq.as_completed``
    takes handles directly.
    """

    __slots__ = ("_core", "_held", "_owner")

    def __init__(self, core: Core, entry: Entry | Ended, owner: ProcQueue | None = None) -> None:
        self._core = core
        held: Held = entry
        if type(entry) is Entry:
            # Not the entry itself but its stand-in, shared by every handle on
            # the claim: once the job completes, a kept handle holds one small
            # object, and the entry is freed (see _core.entries.Face). Made
            # without the lock: a handle made as its job ends, or beside
            # another thread's, may find its stand-in never completed, and
            # reads the entry through it for good, which is as correct.
            face = entry.face
            if face is None:
                face = entry.face = Face(entry)
                if entry.outcome is not None:  # it ended meanwhile: see StateMap._ended
                    entry.face = None
            held = face
        self._held = held
        # The queue, kept alive while a handle on one of its jobs exists.
        self._owner = owner

    @property
    def _entry(self) -> Held:
        """The live entry, or what stands for it once the job ended (read by the Core's waits)."""
        held = self._held
        if type(held) is Face:
            output = held.output  # the live entry, until the job's output replaces it
            return output if type(output) is Entry else held
        return held

    @property
    def key(self) -> str:
        return self._held.key

    @property
    def state(self) -> State:
        """``Pending()``, ``Processing()``, ``Completed(output)`` or ``Failed(failure)``.

        It agrees with ``done()``: on a queue with a store, a job that has
        ended shows its outcome once that is committed, and until then the
        state it ended from (``Processing()``, or ``Pending()`` if it never ran)."""
        entry = self._entry
        if entry.outcome is not None and not self._core.settled(entry):
            return entry.state_before_outcome()  # type: ignore[union-attr]  # (only an Entry is unsettled)
        return entry.state()

    def done(self) -> bool:
        """True once the job has ended, in any way."""
        return self._core.settled(self._entry)

    def result(self, timeout: float | None = None) -> T:
        """The job's output, waiting for it up to ``timeout`` seconds.

        Raises ``JobFailed`` if the job failed, and ``TimeoutError`` if it has
        not ended within ``timeout`` (the job keeps running).
        """
        held = self._held
        if type(held) is Face:
            done: T = held.output
            if type(done) is not Entry:  # completed, and given out: its output, read without a call
                return done
        entry = self._entry
        if not self._core.settled(entry) and not self._wait(timeout):
            raise TimeoutError(f"job {entry.key!r} has not finished after {timeout}s; it keeps running")
        output: T = _unwrap(entry)
        return output

    def _wait(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` for the job to end; False if it has not.
        A job a local worker runs may be read and settled on this thread
        (``Core.lead``: no hand-off from the I/O thread to wake it)."""
        entry = self._entry
        if self._core.settled(entry):
            return True
        if self._owner is not None:
            self._owner._here()  # a forked child's copy: no thread there would ever end the job
        timeout = check_wait(timeout)
        event = self._core.wait_event(entry)  # type: ignore[arg-type]  # (an Ended is settled)
        if event is None:
            return True
        lead = self._core.lead
        return event.wait(timeout) if lead is None else lead(entry, event, timeout)  # type: ignore[arg-type]

    def exception(self, timeout: float | None = None) -> JobFailed | None:
        """The job's ``JobFailed`` if it failed, else None, waiting for it up to
        ``timeout`` seconds (``TimeoutError`` past it; the job keeps running)."""
        try:
            self.result(timeout=timeout)
        except JobFailed as failed:
            return failed
        return None

    def sandbox_refused(self) -> tuple[Refused, ...]:
        """What the network allow-list of the job's sandbox refused it, once it
        has ended (``()`` before): each destination, why, and how many times
        (``procq.Refused``); ``()`` if nothing was, or its lane has none. It is
        the record of the last job of this key that ended; a lane keeps those
        of its last 10,000 jobs that were refused anything (a failed job's
        message names them too)."""
        if not self.done():
            return ()
        key = self.key
        for lane in self._core.lanes.values():
            found = lane.refusals.of(key)
            if found is not None:
                return found
        return ()

    def add_done_callback(self, fn: Callable[[JobHandle[T]], object]) -> None:
        """Call ``fn(handle)`` when the job ends, or at once if it has.

        It runs in whichever thread ended the job (often procq's I/O thread,
        with no lock held), so it should be quick and must not block: hand
        the work to another thread or loop. What it raises is logged (logger
        ``"procq"``) and otherwise ignored, as ``concurrent.futures`` does.
        """
        from procq._api.futures import run_callback

        if not callable(fn):
            raise TypeError(f"add_done_callback(): fn must be callable, got {type(fn).__name__}")

        def ended() -> None:
            run_callback(fn, self)

        if not self._core.add_callback(self._entry, ended):  # type: ignore[arg-type]  # (an Ended is settled)
            ended()

    def cancel(self) -> bool:
        """Cancel this handle's job, as ``q.cancel(key)`` does: True if this call
        cancelled it (a waiting job never runs, a running one is killed; it ends
        ``Failed`` with kind ``"cancelled"``). False, changing nothing, once the
        job has ended, or when the key now names another job than this handle's."""
        if self._core.settled(self._entry) or self._owner is None:
            return False
        core = self._core
        with core.lock:
            ours = core.keys.live.get(self.key) is self._entry
        return ours and self._owner.cancel(self.key)

    def future(self) -> Future[T]:
        """A ``concurrent.futures.Future`` that mirrors this handle: it ends when
        the job does, with its output or its ``JobFailed``; cancelling it
        cancels the job if procq has not started it (see ``procq._api.futures``)."""
        from procq._api.futures import JobFuture

        return JobFuture(self, owned=True, unwrap=False)

    def __await__(self) -> Generator[Any, None, T]:
        entry = self._entry
        if not self._core.settled(entry):
            if self._owner is not None:
                self._owner._here()
            import asyncio  # not at import time: see _queue_async

            loop = asyncio.get_running_loop()
            future: asyncio.Future[None] = loop.create_future()

            def resolve() -> None:
                if not future.done():
                    future.set_result(None)

            def wakeup() -> None:  # runs in whichever thread settled the job
                loop.call_soon_threadsafe(resolve)

            if self._core.add_callback(entry, wakeup):  # type: ignore[arg-type]  # (an Ended is settled)
                yield from future.__await__()
        output: T = _unwrap(entry)
        return output

    def __repr__(self) -> str:
        return f"<JobHandle key={self.key!r} state={self.state!r}>"


def _unwrap(entry: Held) -> Any:  # the T of the handle it serves
    if type(entry) is Face:  # a completed job's stand-in (see JobHandle.__init__)
        return entry.output
    outcome = entry.outcome
    if type(outcome) is Completed:
        return outcome.output
    failure = outcome.failure  # type: ignore[union-attr]
    error = JobFailed(entry.key, failure)
    # The job's own exception where it came back; else, where the worker (or
    # the supervisor, unpickling a result) formatted one, its text.
    cause: BaseException | None = failure.exception
    if cause is None and failure.traceback:
        cause = _RemoteTraceback(failure.traceback)
    try:
        if cause is not None:
            raise error from cause
        raise error
    finally:
        # The traceback holds this frame: without its names the exception
        # and the frame make no cycle, which would keep the frames the
        # exception passed through (their locals: results, arrays mapped
        # from shared memory) until the garbage collector ran.
        del error, cause, entry, outcome
