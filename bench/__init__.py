"""procq's benchmark: ``python -m bench`` from the repository root.

Runs each workload for procq and for each peer
(``concurrent.futures.ProcessPoolExecutor``, ``multiprocessing.Pool``, loky,
pebble, mpire, and a raw pipe floor with no engine at all), 2 workers each,
warmed up, forkserver where the peer allows it, interleaved over rounds, and
prints one table of medians with procq / peer ratios and the targets.

Modules by role: :mod:`bench.jobs` (what the workers run),
:mod:`bench.engines` (procq and the peers behind one face),
:mod:`bench.floor` (the raw pipe floor), :mod:`bench.workloads` (what is
measured; add a workload there), :mod:`bench.report` (machine, table,
targets). Peers are benchmark-only (the ``bench`` extra), never runtime
dependencies of procq.
"""
