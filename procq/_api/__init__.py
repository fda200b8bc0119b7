"""The API: what the caller's threads and event loops call.

Thin faces over one core: every state change goes through ``procq._core``'s
``Core`` (or ``procq._durable``'s ``StoreCore``), the same for sync and async.
The top of the library: may import any layer below, and nothing imports it but
the package root, the command line and ``procq.joblib``.

- ``queue``: ``ProcQueue``, its life (open, closing, closed; foreign in a
  child made by fork, where every method raises ``WrongProcess``) and every
  public method; ``queue_fork``: the at-fork hook; ``queue_async``: opening and
  closing from an event loop; ``queue_maps``: ``q.map`` and ``q.amap``.
- ``config``: ``ProcQueue``'s constructor arguments, checked; the start method
  and the forkserver's preload.
- ``push``: the one push routine behind ``push``/``apush``, ``push_all`` and
  ``map``, differing only in how a push waits for room.
- ``map`` and ``map_async``: the maps themselves.
- ``outcomes``: what a push answers (``Queued``, ``InFlight``, ``Cached``).
- ``handle``: ``JobHandle``. ``futures``: ``JobFuture`` and ``as_completed``.
- ``executor``: ``Executor``, the drop-in ``concurrent.futures.Executor``;
  ``executor_calls``: what it sends to workers; ``executor_feed``: its call
  queue, which hands a lane's workers at most one call more than they run.
- ``monitor``: ``ProcQueue(monitor=True)``'s thread, serving read-only
  snapshots on a UNIX socket only the queue's user can open.
- ``transaction``: ``q.transaction()`` on a store.
- ``shared_queue``: one queue a process reuses across calls with the same
  settings (the joblib backend's, as loky's reusable executor).
"""
