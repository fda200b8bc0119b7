"""A supervisor for test_untrusted_isolation, run as its own process (as root,
or as an unprivileged user): opens a queue with a trusted and an untrusted
lane, has an untrusted job probe the supervisor and the trusted worker, and
prints what the job could do as JSON on stdout."""

from __future__ import annotations

import json
import os
import sys
from multiprocessing import forkserver

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jobs
import jobs_hardening

from procq import Job, JobFailed, Lane, ProcQueue


def _outcome(q: ProcQueue, job: Job) -> object:
    try:
        return q.push_and_wait(job, timeout=60)
    except JobFailed as e:
        return f"failed: {e.failure.kind}: {e.failure.message}"


def main() -> None:
    with ProcQueue({"trusted": 1, "sandbox": Lane(workers=1, trusted=False, cwd="/")}) as q:
        trusted = q.push_and_wait(Job("trusted-pid", jobs.getpid, lane="trusted"), timeout=60)
        targets = {"supervisor": os.getpid(), "trusted worker": trusted}
        address = forkserver._forkserver._forkserver_address  # type: ignore[attr-defined]
        result = {
            "report": _outcome(q, Job("probe", jobs_hardening.probe, args=(targets, address), lane="sandbox")),
            "poisoned": _outcome(q, Job("poison", jobs_hardening.poison_alive_pipes, lane="sandbox")),
            "after": [_outcome(q, Job(f"after:{i}", jobs.square, args=(i,), lane="sandbox")) for i in range(3)],
        }
    print()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
