"""procq's benchmark: ``python -m bench`` from the repository root.

Runs each workload in :mod:`bench.workloads` for procq and for
``concurrent.futures.ProcessPoolExecutor`` side by side (2 workers each, both
warmed up, both with the forkserver start method), interleaved over rounds,
and prints one table of medians with procq/PPE ratios and the targets.

Peers are benchmark-only: nothing here is a runtime dependency of procq.
"""
