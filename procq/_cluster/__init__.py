"""Dask lanes: a lane whose jobs run on a Dask cluster (``procq[dask]``).

A worker kind of its own behind the supervisor's channel interface, so it sits
above ``procq._supervisor``; the API imports it only when a lane is remote.

- ``lane``: ``DaskLane``, the value.
- ``channel``: a slot of a Dask lane: a job at a time, sent as a task through
  the Dask client's event loop.
- ``remote``: the far side, run by the Dask workers: the task that hands each
  job to a procq worker process there and watches it (its death, its time and
  memory limits, a kill).
"""
