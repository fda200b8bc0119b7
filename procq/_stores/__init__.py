"""Stores: where keys outlive the program (``ProcQueue(store=...)``).

The ``Store`` interface and its databases, below the core: the core of a queue
on a store (``procq._durable``) talks to a store only through this interface.
Imports ``procq._wire`` and ``procq._model``; nothing of it is imported
without a store.

- ``base``: the ``Store`` interface, the rows and how a claim is decided on
  them, ``StoreError`` / ``StoreUnavailable``.
- ``sqlite`` and ``postgres``: the two databases.
- ``sqlite_spill``: large outputs in a SQLite file, written in pieces.
- ``urls``: a store from a path or URL (the caller picks the implementation).
"""
