"""The core: every key's life and every lane's jobs, with no I/O.

Every state change happens here, under ``Core.lock``, and is the same for the
sync and asyncio faces. Imports ``procq._wire``, ``procq._system`` and
``procq._model``; never the supervisor, a store or the API above it.

- ``core``: ``Core``, the lock, the clock and the methods the faces and the
  supervisor call; each takes the lock and hands the work to one part.
- ``statemap``: every key's life, and the one place its status (and the counts
  that follow it) changes.
- ``records``: the ``KeyRecords`` interface for keys that ended, and its
  in-memory implementation; ``retention``: how long those records are kept.
- ``dispatch``: the lanes: jobs handed to workers, jobs sent ahead, a worker's
  reports and death; ``answers``: what its operations answer.
- ``stopping``: ending jobs from outside (time and memory limits, cancel,
  closing without waiting); ``timers``: deadlines and due times.
- ``decoding``: jobs that ended and whose outcome a decode thread decodes.
- ``metrics``: what a queue counts as it runs (kept where the state changes,
  under the lock already held) and ``metrics()``, the one snapshot every
  reader takes (``QueueMetrics``, ``LaneMetrics``).
- ``spares``: a lane's warm spare workers (after its first crash).
- ``channel``: ``WorkerChannel``, the interface through which the supervisor
  reaches a worker of any kind (its kinds are ``procq._supervisor.loop``'s and
  ``procq._cluster``'s); a ``WorkerSlot`` keeps its worker's channel.
- ``entries``: the bookkeeping objects: ``Entry`` (one claim of a key),
  ``WorkerSlot`` and its ``WorkerLife``, ``LaneState``.
"""
