"""The core of a queue on a store: claims and outcomes as rows.

``StoreCore`` is a ``Core`` whose keys live in a ``procq._stores`` store, so
that several programs share them. Imports ``procq._core`` and
``procq._stores``; beside the supervisor, never importing it.

- ``core``: ``StoreCore``: claims in the database's group transaction, ended
  keys as rows.
- ``commit``: the queued row writes, the ``Committer`` thread that commits
  them, and the wake-ups held back until they are durable.
- ``records``: ``StoreRecords``, ended keys read from and written to rows.
- ``outputs``: a decoded output encoded for its row off the lock, and a large
  one written in pieces, before the job ends for the core.
- ``read``: ``q.state`` and ``q.keys`` over rows and live keys.
- ``remote``: keys live in other queues (``RemoteEntry``) and the ``Watcher``
  thread (the lease, joiners of other queues' keys, wakes from other queues).
"""
