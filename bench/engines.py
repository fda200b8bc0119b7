"""The engines the benchmark compares: procq and its peers, behind one small face.

Each engine is opened with ``workers`` worker processes and, wherever the
engine lets us choose, the forkserver start method. An :class:`Engine` can
``submit(fn, *args)`` and wait for a ``result(future, timeout)``; a timeout
always raises the built-in ``TimeoutError``, whatever the engine's own type.
``crash_signal(exc)`` says which signal, if any, the engine's exception for a
killed worker names.

Peers are benchmark-only dependencies (``pip install -e '.[bench]'``); one that
is not installed is left out of the run, with the reason printed. procq and
the three that need nothing beyond the standard library (ProcessPoolExecutor,
multiprocessing.Pool, the two floors) always run.
"""

from __future__ import annotations

import importlib.util
import itertools
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass
from typing import Any

from bench import jobs

#: The start method of every engine that lets us choose; None: each engine's
#: own default (``use_default_start_methods``).
START_METHOD: str | None = "forkserver"

_key_ids = itertools.count(1)


def context() -> Any:
    return multiprocessing.get_context(START_METHOD)


def use_default_start_methods() -> None:
    """From now on, open every engine with its own default start method (as
    a program that does not choose gets): ``fork`` for the standard
    library's pools, pebble and mpire on Linux before Python 3.14, loky's own,
    procq's ``forkserver``."""
    global START_METHOD
    START_METHOD = None


def _signal_in(exc: BaseException) -> str | None:
    """A signal name or negative exit code that an exception's text or attributes name."""
    code = getattr(exc, "exitcode", None)
    if isinstance(code, int) and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    text = str(exc)
    for sig in (signal.SIGKILL, signal.SIGSEGV, signal.SIGTERM, signal.SIGABRT):
        if sig.name in text:
            return sig.name
    return None


class Engine:
    """One opened engine. Subclasses fill in the four operations."""

    name = "?"

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        raise NotImplementedError

    def result(self, future: Any, timeout: float) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        """Close an idle engine the normal, waiting way."""
        raise NotImplementedError

    def abort(self) -> None:
        """Tear the engine down without waiting (after a hang or a break)."""
        self.close()

    def crash_signal(self, exc: BaseException) -> str | None:
        return _signal_in(exc)


class ProcqEngine(Engine):
    name = "procq"

    def __init__(self, workers: int) -> None:
        from procq import Job, ProcQueue

        self.q = ProcQueue(lanes=workers, start_method=START_METHOD)
        self._job = Job
        self._push = self.q.push

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        # A fresh key per job: the full state map is part of what procq pays.
        return self._push(self._job(f"b{next(_key_ids)}", fn, args=args)).handle

    def result(self, future: Any, timeout: float) -> Any:
        return future.result(timeout=timeout)

    def close(self) -> None:
        self.q.close()

    def abort(self) -> None:
        self.q.close(wait=False)

    def crash_signal(self, exc: BaseException) -> str | None:
        failure = getattr(exc, "failure", None)
        return getattr(failure, "signal", None) if failure is not None else _signal_in(exc)


class FuturesEngine(Engine):
    """Any engine whose submit returns a ``concurrent.futures.Future``."""

    def result(self, future: Any, timeout: float) -> Any:
        try:
            return future.result(timeout)
        except FuturesTimeout:  # not the built-in TimeoutError before Python 3.11
            raise TimeoutError(f"{self.name}: no result within {timeout}s") from None


class PPEEngine(FuturesEngine):
    name = "PPE"

    def __init__(self, workers: int) -> None:
        from concurrent.futures import ProcessPoolExecutor

        self.ex = ProcessPoolExecutor(max_workers=workers, mp_context=context())
        self.submit = self.ex.submit  # type: ignore[method-assign]

    def close(self) -> None:
        self.ex.shutdown(wait=True)

    def abort(self) -> None:
        self.ex.shutdown(wait=True, cancel_futures=True)


class LokyEngine(FuturesEngine):
    name = "loky"

    def __init__(self, workers: int) -> None:
        import loky
        from loky.backend.context import get_context

        self.ex = loky.ProcessPoolExecutor(max_workers=workers, context=get_context(START_METHOD))
        self.submit = self.ex.submit  # type: ignore[method-assign]

    def close(self) -> None:
        self.ex.shutdown(wait=True)

    def abort(self) -> None:
        self.ex.shutdown(wait=True, kill_workers=True)


class PebbleEngine(FuturesEngine):
    name = "pebble"

    def __init__(self, workers: int) -> None:
        import pebble

        self.pool = pebble.ProcessPool(max_workers=workers, context=context())
        self._schedule = self.pool.schedule

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._schedule(fn, args=args)

    def close(self) -> None:
        self.pool.close()
        self.pool.join()

    def abort(self) -> None:
        self.pool.stop()
        self.pool.join()


class MpPoolEngine(Engine):
    name = "mp.Pool"

    def __init__(self, workers: int) -> None:
        self.pool = context().Pool(workers)
        self._apply = self.pool.apply_async

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._apply(fn, args)

    def result(self, future: Any, timeout: float) -> Any:
        try:
            return future.get(timeout)
        except multiprocessing.TimeoutError:
            raise TimeoutError(f"{self.name}: no result within {timeout}s") from None

    def close(self) -> None:
        self.pool.close()
        self.pool.join()

    def abort(self) -> None:
        self.pool.terminate()
        self.pool.join()


class MpireEngine(Engine):
    name = "mpire"

    def __init__(self, workers: int) -> None:
        from mpire import WorkerPool

        if START_METHOD is None:
            self.pool = WorkerPool(n_jobs=workers)
        else:
            self.pool = WorkerPool(n_jobs=workers, start_method=START_METHOD)
        self._apply = self.pool.apply_async

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._apply(fn, args)

    def result(self, future: Any, timeout: float) -> Any:
        try:
            return future.get(timeout)
        except multiprocessing.TimeoutError:
            raise TimeoutError(f"{self.name}: no result within {timeout}s") from None

    def close(self) -> None:
        self.pool.stop_and_join()

    def abort(self) -> None:
        # After a worker was killed halfway through writing a result, mpire's
        # results thread blocks for ever on the rest of that message, and
        # terminate() joins it (it kills the workers first): wait a bounded
        # time, then leave its daemon threads behind, so one run of the bench
        # cannot hang on a peer.
        ending = threading.Thread(target=self.pool.terminate, daemon=True)
        ending.start()
        ending.join(MPIRE_TERMINATE_BOUND)
        if ending.is_alive():
            print(f"mpire: terminate() still blocked after {MPIRE_TERMINATE_BOUND:g}s; left behind", file=sys.stderr)


#: How long the bench waits for mpire's terminate() (see ``MpireEngine.abort``).
MPIRE_TERMINATE_BOUND = 10.0


class FloorEngine(Engine):
    name = "raw pipe"

    def __init__(self, workers: int) -> None:
        from bench.floor import RawPipes

        self.pool = RawPipes(workers, context())
        self.submit = self.pool.submit  # type: ignore[method-assign]

    def result(self, future: Any, timeout: float) -> Any:
        return future.result(timeout)

    def close(self) -> None:
        self.pool.close()


class BareEngine(Engine):
    name = "bare pipe"

    def __init__(self, workers: int) -> None:
        from bench.floor import BarePipes

        self.pool = BarePipes(workers, context())
        self.submit = self.pool.submit  # type: ignore[method-assign]
        self.result = self.pool.result  # type: ignore[method-assign]

    def close(self) -> None:
        self.pool.close()


@dataclass(frozen=True)
class Peer:
    """An engine the benchmark can run: how to open it, and what it needs installed."""

    name: str
    open: Callable[[int], Engine]
    needs: str | None  # the module it imports, for the availability check
    how: str  # how it is configured, for the report
    workloads: tuple[str, ...] | None = None  # the only workloads it runs (None: every one)

    def runs(self, workload: str) -> bool:
        return self.workloads is None or workload in self.workloads

    def missing(self) -> str | None:
        """Why this engine cannot run here, or None."""
        if self.needs is None or importlib.util.find_spec(self.needs) is not None:
            return None
        return f"{self.needs} is not installed (pip install -e '.[bench]')"


#: Every engine, in the table's column order. procq first, the floors last.
PEERS: list[Peer] = [
    Peer("procq", ProcqEngine, None, f"ProcQueue(lanes=2, start_method={START_METHOD!r}), a fresh key per job"),
    Peer("PPE", PPEEngine, None, "concurrent.futures.ProcessPoolExecutor(2, mp_context=forkserver)"),
    Peer("mp.Pool", MpPoolEngine, None, "multiprocessing.get_context('forkserver').Pool(2).apply_async"),
    Peer("loky", LokyEngine, "loky", "loky.ProcessPoolExecutor(2, context=loky forkserver)"),
    Peer("pebble", PebbleEngine, "pebble", "pebble.ProcessPool(2, context=forkserver).schedule"),
    Peer("mpire", MpireEngine, "mpire", "mpire.WorkerPool(2, start_method='forkserver').apply_async"),
    Peer("raw pipe", FloorEngine, None, "one forkserver child per worker, its own Pipe, pickled tuples, no engine"),
    Peer(
        "bare pipe",
        BareEngine,
        None,
        "the latency floor: a forkserver child per worker, its Pipe written and read by the caller, no poll",
        workloads=("latency",),
    ),
]
BY_NAME = {p.name: p for p in PEERS}


def every_worker(engine: Engine, workers: int, timeout: float = 60.0) -> None:
    """Run naps, one per worker at once, until every worker has run one: each has
    then started and imported the job module. (A worker slow to start can let
    another take both naps, so a round may not reach all of them.)"""
    seen: set[int] = set()
    seconds = 0.02
    for _ in range(8):
        futures = [engine.submit(jobs.nap, seconds) for _ in range(workers)]
        seen |= {engine.result(f, timeout) for f in futures}
        if len(seen) >= workers:
            return
        seconds *= 2
    raise RuntimeError(f"warm-up reached {len(seen)} of {workers} {engine.name} workers")


def warm(engine: Engine, workers: int, jobs_after: int, timeout: float = 60.0) -> None:
    """Every worker up and has run a job; then ``jobs_after`` no-op round trips.
    Raises ``TimeoutError`` from an engine that does not answer within ``timeout``."""
    every_worker(engine, workers, timeout)
    for _ in range(jobs_after):
        engine.result(engine.submit(jobs.noop), timeout)


def preload_jobs_module(ctx: Any) -> None:
    """Add :mod:`bench.jobs` to the modules the forkserver will import, keeping
    those already asked for (only before the server starts)."""
    from multiprocessing import forkserver

    wanted = list(forkserver._forkserver._preload_modules)  # type: ignore[attr-defined]
    if jobs.__name__ not in wanted:
        ctx.set_forkserver_preload([*wanted, jobs.__name__])


def ensure_forkserver(preload_jobs: bool = True) -> None:
    """Start multiprocessing's forkserver (shared by every engine that uses it)
    before anything is timed, so the first engine to start does not pay for it.

    With the preload procq asks for when it is the one to start it (see
    ``procq._api.config.preload_worker``): the server imports procq (and the
    program's main module, when it is a script: not ``python -m bench``'s)
    once, and every child, of any engine, starts with them.

    With ``preload_jobs``, the server also imports :mod:`bench.jobs`, the
    module every engine's jobs come from, as procq's docs advise a program
    to do with its own job modules ("Faster worker starts" in docs/lanes.md):
    otherwise each new worker, of every engine, imports it on its first job,
    which in a forked child costs about 1 ms of CPU however small the module
    (2 ms compiled from source, with no ``.pyc``), in 120-200 copy-on-write
    page faults, paid again by each replacement of a crashed worker."""
    from procq._api.config import preload_worker

    if preload_jobs:
        preload_jobs_module(context())
    preload_worker(context())
    p = context().Process(target=jobs.noop)
    p.start()
    p.join()
    assert p.exitcode == 0, p.exitcode


def rss_bytes(pid: int | None = None) -> int:
    import psutil

    return int(psutil.Process(pid or os.getpid()).memory_info().rss)
