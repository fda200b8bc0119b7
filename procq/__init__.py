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
The public names below are re-exported from private modules, one role each.

Values and configuration (no state, no threads):

- ``_model.job``: ``Job``, ``Lane``, ``Retry``, ``Retention`` and the checks behind
  their arguments; ``_job_of``: ``Job.of``, a job whose arguments mypy
  checks. ``_cluster.lane``: ``DaskLane``, a lane whose jobs run on a Dask
  cluster (``procq[dask]``). ``_model.settings``: byte sizes, and a lane's worker settings
  (env, rlimits, cwd, worker counts against the descriptor limit).
- ``_model.values``: where a key is (``Pending`` ... ``Failed``, ``Failure``,
  ``FailureKind``), push outcomes, stats.
- ``_model.errors``: the exception tree; ``_wire.fingerprint``: what a claim remembers of
  its payload to catch a key reused for other work.
- ``_api.config``: ``ProcQueue``'s constructor arguments, checked; the start method.

The faces (caller threads and event loops):

- ``_api.queue``: ``ProcQueue``, its life (open, closing, closed; foreign in a
  child made by fork, where every method raises ``WrongProcess``; the at-fork
  hook is ``_api.queue_fork``) and every public method. ``_api.push``: the one push routine behind ``push``/``apush``,
  ``push_all``/``apush_all`` and ``map``, differing only in how a push waits
  for room. ``_api.queue_maps``: ``q.map`` and ``q.amap``, typed; the maps
  themselves are ``_api.map`` and ``_api.map_async``. ``_api.queue_async``: opening and
  closing from an event loop (``ProcQueue.aopen``, ``aclose``, ``async
  with``) and what cancelling them does. ``_api.handle``: ``JobHandle``.
- ``_api.futures``: ``JobFuture`` (a ``concurrent.futures.Future`` that mirrors a
  handle) and ``as_completed``. ``_api.executor``: ``Executor``, the drop-in
  ``concurrent.futures.Executor`` over a ``ProcQueue``; ``_api.executor_feed``:
  its call queue (calls handed to the queue a lane's workers + 1 ahead, and
  the thread that hands them over); ``_api.executor_calls``: what it sends to
  workers (its initializer's wrapper, ``InitializerFailed``, a map's chunks).

The core (I/O-free; every change under ``Core.lock``):

- ``_core.core``: ``Core``, the lock, the clock and the methods the faces and the
  supervisor call; each takes the lock and hands the work to one part:
- ``_core.statemap``: every key's life and the one place its status (and the counts
  that follow it) changes. ``_core.records``: the ``KeyRecords`` interface for keys
  that ended, and its in-memory implementation. ``_core.retention``: those records
  and how long they are kept.
- ``_core.dispatch``: the lanes: jobs handed to workers, jobs sent ahead, a worker's
  reports and death. ``_core.stopping``: ending jobs from outside (time and memory
  limits, cancel, closing without waiting). ``_core.timers``: deadlines and due times.
  ``_core.decoding``: jobs that ended and whose outcome a decode thread decodes.
  ``_core.spares``: a lane's warm spare workers (after its first crash).
- ``_core.entries``: the bookkeeping objects: ``Entry`` (one claim of a key),
  ``WorkerSlot`` and its ``WorkerLife``, ``LaneState``.
- ``_core.metrics``: what the parts count as state changes (a lane's ``Tally``,
  fixed-bucket histograms) and ``metrics()``, the one snapshot of it
  (``QueueMetrics``, ``LaneMetrics``) behind ``q.metrics()``.

Keys that outlive the program (``ProcQueue(store=...)``; none of it is
imported without a store):

- ``_stores.base``: the ``Store`` interface, the rows and how a claim is decided on
  them, URLs, ``StoreError`` / ``StoreUnavailable``. ``_stores.sqlite`` and
  ``_stores.postgres``: the two databases.
- ``_durable.core``: ``StoreCore``, the ``Core`` of a queue on a store: claims
  in the database's group transaction, ended keys as rows (``StoreRecords``,
  in ``_durable.records``). ``_durable.commit``: the queued row writes, the
  ``Committer`` thread that commits them, and the wake-ups held back until
  they are durable. ``_api.transaction``: ``q.transaction()``. ``_durable.read``:
  ``q.state`` and ``q.keys`` over rows and live keys. ``_durable.remote``:
  keys live in other queues (``RemoteEntry``) and the ``Watcher`` thread (the
  lease, joiners of other queues' keys, wakes from other queues).

The supervisor's I/O side (its one thread per queue):

- ``_supervisor.loop``: the I/O thread's loop, with a diagram of who owns what and
  what each pipe carries. ``_supervisor.start``: what it starts, and the
  starter thread that starts worker processes off it. ``_supervisor.wait``:
  what it waits on (one selector), its timers and its last wait for workers. ``_supervisor.decode``:
  the lanes' decode threads. ``_supervisor.failures``: how it words the
  failures it gives jobs. ``_supervisor.log``: what it logs as it decides (the
  ``procq.worker`` and ``procq.job`` loggers, silent by default).
- ``_supervisor.channels``: the ``WorkerChannel`` interface through which the supervisor
  reaches a worker; ``_supervisor.channel_trusted`` and ``_supervisor.channel_untrusted`` are its two
  local kinds, ``_cluster.channel`` a slot of a Dask lane (a job at a time, sent
  as a task through the Dask client's event loop). ``_system.processes``: processes,
  their trees, memory and exits.
  ``_supervisor.undertaker``: the small process per queue that kills the workers'
  process groups should the supervisor's process die.
- ``_wire.protocol``: what travels on a worker's pipe, framed, and the typed events
  it decodes to. ``_wire.plain``: which pickles unpickle without running code.

The worker processes: ``_worker.trusted`` (a trusted worker's loop, and what both
kinds share; ``_worker.parent``: how a trusted worker follows its
supervisor's life) and ``_worker.untrusted`` (a clean worker that forks a
process per job; ``_wire.json_keys``: its results' dict keys, checked).
``_system.privileges``: what a process lets others do to it (dumpable or
not) and may do itself (capabilities, ``no_new_privs``, Landlock), and the
supervisor's "untraceable" latch. ``_model.sandbox``: ``Sandbox`` (what a
sandboxed lane's jobs may reach), and what this kernel can enforce of it
(``SandboxUnavailable``); ``_system.sandbox_linux``: its kernel mechanics
(namespaces and the jobs' view, Landlock rules, the probe);
``_worker.sandbox``: a sandboxed worker's side of them; ``_system.seccomp``: the
seccomp filter, assembled by hand. ``_worker.forkserver_guard``: imported only by the
forkserver procq starts, to make it untraceable and fork only for its parent;
``_worker.forkserver_main``: imported there too, to import the program's main module
once, in the server, not in every worker. ``_worker.template``: a trusted lane's
template, the booted process its replacements and spares fork from.
``_cluster.remote``: the far side of a Dask lane, run by the Dask workers: the
task that hands each job to a procq worker process there and watches it
(its death, its time and memory limits, a kill).

The command line (``procq``, ``python -m procq``; ``__main__`` picks the
command): ``_cli.demo`` and ``_cli.demo_jobs``: ``procq demo``. ``_cli.run``: ``procq run
MODULE:FUNCTION``, a function over the items of a file, resumable through a
store; ``_cli.report``: its progress bar and summary. ``_cli.top``: ``procq top``,
a live view of this user's monitored queues, read through ``_api.monitor``
(a queue's snapshot socket, ``ProcQueue(monitor=True)``, and how it is
found). ``examples``: a stage and an input for it, shipped with the package.

Fitting other tools (imported only by whoever uses them): ``joblib``
(``procq.joblib``, public): importing it registers the joblib backend
``"procq"``, each ``Parallel`` batch a procq job (``procq[joblib]``).
``metrics`` (``procq.metrics``, public): exporters of ``q.metrics()``:
``metrics.prometheus`` (a collector, an HTTP endpoint; ``procq[prometheus]``)
and ``metrics.otel`` (observable instruments, a span per job; ``procq[otel]``).

Which thread touches what
-------------------------
======================  ==========================================================
thread                  may touch
======================  ==========================================================
a caller's thread, or   ``Core``'s parts and every ``Entry`` and ``LaneState``, only
an event loop           under ``Core.lock``; a worker's pipe, to send a job it was
                        given the right to send (``WorkerSlot.sending``); a handle's
                        event or future, with no lock held
the I/O thread          the same under ``Core.lock``; alone: the selector, every
                        channel's read side, starting, signalling and reaping
                        processes, closing a pipe once no thread may send on it
any thread, no lock     a completed key's record, when no retention is set (a dict
                        read is atomic and records never change in place)
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
a queue's monitor       its socket and clients alone; ``Core``'s counters only
thread (``_api.monitor``)   to copy them, under ``Core.lock``, in ``_metrics.metrics``
======================  ==========================================================

With a store, ``StoreCore.db_lock`` serialises the queue's database
connection: pushing threads run their claims under it, the ``Committer``
thread its commits, a ``q.transaction()`` holds it while open; the
``Watcher`` has a connection of its own. ``db_lock`` is taken before
``Core.lock``, never while holding it, and no statement runs under
``Core.lock``; the committer's ``Commits`` lock is a leaf.

Lock order: ``Core.lock`` is the only lock the core has; a worker's write lock
(``ProcessChannel.write_lock``) and a decode thread's queue lock are taken
with no other lock held. No lock is
held across user code, pickling, a pipe send or an await.
"""

from typing import TYPE_CHECKING, Any

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
    "PostgresStore": "procq._stores.postgres",
    "SqliteStore": "procq._stores.sqlite",
    "Store": "procq._stores.base",
    "StoreError": "procq._stores.base",
    "StoreUnavailable": "procq._stores.base",
    "DaskLane": "procq._cluster.lane",
    "Executor": "procq._api.executor",
    "InitializerFailed": "procq._api.executor_calls",
    "as_completed": "procq._api.futures",
    "JobHandle": "procq._api.handle",
    "ProcQueue": "procq._api.queue",
    "Job": "procq._model.job",
    "Lane": "procq._model.job",
    "Retention": "procq._model.policies",
    "Retry": "procq._model.policies",
    "Sandbox": "procq._model.sandbox",
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
    from procq._api.executor_calls import InitializerFailed
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
    from procq._model.policies import Retention, Retry
    from procq._model.sandbox import Sandbox
    from procq._model.values import Completed, Failed, Failure, FailureKind, LaneStats, Pending, Processing, QueueStats
    from procq._stores.base import Store, StoreError, StoreUnavailable
    from procq._stores.postgres import PostgresStore
    from procq._stores.sqlite import SqliteStore


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
