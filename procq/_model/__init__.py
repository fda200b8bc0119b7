"""The model: what a job, a lane and an outcome are, as values.

Frozen values and the checks behind their arguments; no state, no threads, no
I/O. Everything else in procq may import this package; it imports nothing of
procq outside itself.

- ``job``: ``Job``, its typed builder ``JobOf`` (``Job.of``) and ``Lane``, with
  the checks on time limits.
- ``policies``: ``Retry`` and ``Retention``.
- ``values``: where a key is (``Pending`` ... ``Failed``), ``Failure`` and its
  kinds, push outcomes, stats.
- ``sandbox``: ``Sandbox``, what a sandboxed lane's jobs may reach.
- ``sandbox_bounds``: a ``Sandbox``'s bounds on how much they may take, checked.
- ``network``: a sandbox's network allow-list (its entries, checked; the
  decisions on them), and ``Refused``, what it refused a job.
- ``errors``: the exception tree.
- ``settings``: byte sizes, and a lane's worker settings (env, rlimits, cwd,
  worker counts against the descriptor limit).
"""
