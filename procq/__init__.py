"""procq: keyed jobs in supervised worker processes.

Every job carries a key. Pushing a key that is running joins it (``InFlight``),
one that completed returns its stored output (``Cached``), one that failed runs
fresh (``Queued``). The process that opens the queue is the supervisor; every
job runs in a child worker process, and a child that crashes fails only its own
job::

    from procq import ProcQueue, Job

    with ProcQueue(lanes={"cpu": 2}) as q:
        print(q.push_and_wait(Job("square:7", pow, args=(7, 2))))

A map of the package
--------------------
The public names below are re-exported from private subpackages, one role
each, in layers: a module imports only from its own layer and the layers
below it (checked by the import-linter contract in ``pyproject.toml``). From
the top:

- ``__main__``, ``_cli``: the command line (``procq run``, ``procq demo``,
  ``procq top``); ``joblib``: the joblib backend, and ``metrics``: the
  Prometheus and OpenTelemetry exporters (public, each imported only by
  whoever uses it).
- ``_api``: what callers call: ``ProcQueue``, pushes, maps, handles,
  futures, the ``Executor``, a store's transactions.
- ``_cluster``: Dask lanes, a kind of worker behind the supervisor's channels.
- ``_supervisor``: the I/O thread that starts, watches and reaps workers, and
  the channels to each kind of local worker. ``_durable``: the core of a
  queue on a store (claims and outcomes as rows). Neither imports the other.
- ``_core``: the I/O-free core: every key's life and every lane's jobs, under
  one lock.
- ``_stores``: the ``Store`` interface, SQLite and PostgreSQL. ``_worker``:
  what runs in a worker process (it imports nothing above this line).
- ``_wire``: what crosses a pipe or a row (framing, events, fingerprints, safe
  unpickling). ``_system``: processes, their trees, privileges, sandboxes.
- ``_model``: the values: ``Job``, ``Lane``, ``Sandbox``, ``Retry``,
  ``Retention``, key states, ``Failure``, errors, settings.

``_moved`` lets pickles that name a public class's module from before this
layout (``procq._values.Failure``) still load. ``examples``: a stage and an
input for it, shipped with the package.

Which thread touches what
-------------------------
======================  ==========================================================
thread                  may touch
======================  ==========================================================
a caller's thread, or   ``Core``'s parts and every ``Entry`` and ``LaneState``, only
an event loop           under ``Core.lock``; a worker's pipe, to send a job it was
                        given the right to send (``WorkerSlot.sending``); a handle's
                        event or future, with no lock held; an entry's ``face``,
                        set once, with no lock, by the first handle made on it
the I/O thread          the same under ``Core.lock``; alone: the selector, every
                        channel's read side, starting, signalling and reaping
                        processes, closing a pipe once no thread may send on it
any thread, no lock     a completed key's record, when no retention is set (a dict
                        read is atomic and records never change in place); a
                        handle's stand-in (``Face``: its one change, the output
                        written in place of the live entry, is a single store)
a lane's decode thread  what its lane's reports left undecoded, with no lock held (it
                        may run the job's classes' code); then ``Core.decoded``, or
                        the I/O thread's inbox of decoded messages
a queue's starter       starting the local processes the I/O thread asks for, and
thread                  a trusted lane's template (made, asked to fork, checked
                        alive: ``_worker.template``); each start handed back to the I/O
                        thread, nothing else touched
a worker process        nothing of the supervisor's: only its own pipe
a lane's template       nothing of the supervisor's: its request pipe (the starter
(a process)             thread's) and its exit pipe (read by the I/O thread alone)
a store's committer     the queue's database connection under ``db_lock``; then
                        the wake-ups its commit released, with no lock held
a Dask client's event   a Dask slot's own task state, its inbox (a deque) and its
loop thread             two pipes' write ends, under the slot's lock; never
                        ``Core``, never user code
a child made by fork    nothing of its parent's queue: the fork marks its copy
                        foreign (``WrongProcess``), and it closes nothing at exit
an Executor's feed      what a caller's thread may (it pushes the executor's calls
thread                  as they get room); the feed's own waiting calls, under its lock
a queue's monitor       its socket and clients alone (``_api.monitor``); ``Core``'s
thread                  counters only to copy them, under ``Core.lock``
                        (``_core.metrics.metrics``)
a lane's egress proxy   (a lane with a network allow-list) its listeners and the
(an acceptor thread,    job's sockets; a worker's gate under the gate's lock;
one per connection)     never ``Core``, never user code
======================  ==========================================================

With a store, ``StoreCore.db_lock`` serialises the queue's database
connection: pushing threads run their claims under it, the ``Committer``
thread its commits, a ``q.transaction()`` holds it while open; the
``Watcher`` has a connection of its own. ``db_lock`` is taken before
``Core.lock``, never while holding it, and no statement runs under
``Core.lock``; the committer's ``Commits`` lock is a leaf.

Lock order: ``Core.lock`` is the only lock the core has; a worker's write lock
(``ProcessChannel.write_lock``), a decode thread's queue lock, an egress
gate's lock and a lane's ``Refusals`` lock are taken with no other lock held. No lock is
held across user code, pickling, a pipe send or an await.
"""

from typing import TYPE_CHECKING, Any

from procq import _moved

_moved.install()

# The public names are loaded on first use, not at import: worker processes
# import this package too (to reach procq._worker.trusted), and should not pay for the
# supervisor's side (asyncio, threading machinery) on every start.
_SOURCES = {
    "JobFailed": "procq._model.errors",
    "JobPicklingError": "procq._model.errors",
    "KeyConflict": "procq._model.errors",
    "KeyConflictWarning": "procq._model.errors",
    "LaneFull": "procq._model.errors",
    "ProcQueueError": "procq._model.errors",
    "QueueClosed": "procq._model.errors",
    "SandboxUnavailable": "procq._model.errors",
    "WrongProcess": "procq._model.errors",
    "InitializerFailed": "procq._worker.initializer",
    "PostgresStore": "procq._stores.postgres",
    "SqliteStore": "procq._stores.sqlite",
    "Store": "procq._stores.base",
    "StoreError": "procq._stores.base",
    "StoreUnavailable": "procq._stores.base",
    "DaskLane": "procq._cluster.lane",
    "Executor": "procq._api.executor",
    "as_completed": "procq._api.futures",
    "JobHandle": "procq._api.handle",
    "ProcQueue": "procq._api.queue",
    "Job": "procq._model.job",
    "Lane": "procq._model.job",
    "Retention": "procq._model.policies",
    "Retry": "procq._model.policies",
    "Sandbox": "procq._model.sandbox",
    "Refused": "procq._model.network",
    "Cached": "procq._api.outcomes",
    "Completed": "procq._model.values",
    "Failed": "procq._model.values",
    "Failure": "procq._model.values",
    "FailureKind": "procq._model.values",
    "InFlight": "procq._api.outcomes",
    "LaneStats": "procq._model.values",
    "LaneMetrics": "procq._core.metrics",
    "QueueMetrics": "procq._core.metrics",
    "Pending": "procq._model.values",
    "Processing": "procq._model.values",
    "QueueStats": "procq._model.values",
    "Queued": "procq._api.outcomes",
}

if TYPE_CHECKING:
    from procq._api.executor import Executor
    from procq._api.futures import as_completed
    from procq._api.handle import JobHandle
    from procq._api.outcomes import Cached, InFlight, Queued
    from procq._api.queue import ProcQueue
    from procq._cluster.lane import DaskLane
    from procq._core.metrics import LaneMetrics, QueueMetrics
    from procq._model.errors import (
        JobFailed,
        JobPicklingError,
        KeyConflict,
        KeyConflictWarning,
        LaneFull,
        ProcQueueError,
        QueueClosed,
        SandboxUnavailable,
        WrongProcess,
    )
    from procq._model.job import Job, Lane
    from procq._model.network import Refused
    from procq._model.policies import Retention, Retry
    from procq._model.sandbox import Sandbox
    from procq._model.values import Completed, Failed, Failure, FailureKind, LaneStats, Pending, Processing, QueueStats
    from procq._stores.base import Store, StoreError, StoreUnavailable
    from procq._stores.postgres import PostgresStore
    from procq._stores.sqlite import SqliteStore
    from procq._worker.initializer import InitializerFailed


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module 'procq' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SOURCES))


__version__ = "0.1.0"

__all__ = [
    "Cached",
    "Completed",
    "DaskLane",
    "Executor",
    "Failed",
    "Failure",
    "FailureKind",
    "InFlight",
    "InitializerFailed",
    "Job",
    "JobFailed",
    "JobHandle",
    "JobPicklingError",
    "KeyConflict",
    "KeyConflictWarning",
    "Lane",
    "LaneFull",
    "LaneMetrics",
    "LaneStats",
    "Pending",
    "PostgresStore",
    "ProcQueue",
    "ProcQueueError",
    "Processing",
    "QueueClosed",
    "QueueMetrics",
    "QueueStats",
    "Queued",
    "Refused",
    "Retention",
    "Retry",
    "Sandbox",
    "SandboxUnavailable",
    "SqliteStore",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "WrongProcess",
    "as_completed",
]
