"""The crash batch with a heavy job module: ``python bench/crash_heavy.py
ENGINE CONFIG_JSON TMP lazy|top``.

``bench.workloads.crash_batch`` (a batch of jobs at once, every
``crash_every``-th of which SIGKILLs its worker) with its job in
``bench.heavy_jobs``, a module that imports numpy and scipy (about 0.4 s of
CPU per import), run as a program of its own with the engine's default
start method. Before the batch, untimed, every worker runs the job once, as
the program's earlier work would have. Prints the figures as one line of
JSON.

- ``lazy``: the program imports the job module under its main guard, as a
  CLI that imports its tasks after parsing its arguments does, so the
  forkserver never imports it: each new worker needs it, and what procq
  learns of it (``procq._worker.warm``) is all that spares replacements
  their import.
- ``top``: the module is imported at this script's top, so the forkserver
  imports it with the main module: what the lazy case is measured against.
"""

from __future__ import annotations

import json
import sys

if __name__ != "__main__" and sys.argv[4:5] == ["top"]:
    # The forkserver (and each child of a spawn start), importing this script
    # as __mp_main__ with the program's argv, imports the job module too.
    import bench.heavy_jobs  # noqa: F401


def main(engine: str, config: str, tmp: str, mode: str) -> None:
    from bench import engines, heavy_jobs
    from bench.workloads import Config, crash_batch

    engines.use_default_start_methods()
    cfg = Config(**json.loads(config))
    print(json.dumps(crash_batch(engines.BY_NAME[engine], cfg, tmp, heavy_jobs.double_or_die, job_warmup=True)))


if __name__ == "__main__":
    if sys.argv[4] not in ("lazy", "top"):
        raise SystemExit(f"the mode must be 'lazy' or 'top', got {sys.argv[4]!r}")
    main(*sys.argv[1:5])
