"""The command line (``procq``, ``python -m procq``; ``procq.__main__`` picks
the command). Uses procq as a program would, through ``procq._api``.

- ``run``: ``procq run MODULE:FUNCTION``, a function over the items of a file,
  resumable through a store; ``report``: its progress bar and summary.
- ``demo`` and ``demo_jobs``: ``procq demo``.
- ``top``: ``procq top``, a live screen of this user's monitored queues.
"""
