"""Run as a script by test_fork_safety: a process that forks while its queue has
a job running, and a child that then ends in one of the ordinary ways (``argv[1]``):

- ``exit``: interpreter exit with the queue open (atexit handlers, finalizers);
- ``gc``: drops the queue and collects it, then exits;
- ``with``: leaves the parent's ``with`` block as it unwinds, then exits.

The parent checks that its own queue carried on untouched, and prints ``ok``.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time

import jobs

from procq import Job, ProcQueue


def main(mode: str) -> None:
    child = False
    with ProcQueue({"cpu": 2}) as q:
        assert q.push_and_wait(Job("warm", jobs.square, args=(2,)), timeout=20) == 4
        pids = sorted(q._worker_pids())
        running = q.push(Job("running", jobs.sleep, args=(1.0,))).handle  # type: ignore[union-attr]
        pid = os.fork()
        if pid == 0:
            child = True
            if mode == "gc":
                del q, running
                gc.collect()
            if mode != "with":
                sys.exit(0)
        else:
            deadline = time.monotonic() + 10
            while True:  # the child must end on its own, at once: it holds nothing to wait for
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)  # (ours: leave nothing behind)
                    os.waitpid(pid, 0)
                    raise AssertionError("the forked child hangs at its exit")
                time.sleep(0.02)
            assert os.waitstatus_to_exitcode(status) == 0, status
            assert running.result(timeout=20) == 1.0
            assert q.push_and_wait(Job("after", jobs.square, args=(3,)), timeout=20) == 9
            assert sorted(q._worker_pids()) == pids, (q._worker_pids(), pids)
            lane = q.stats().lanes["cpu"]
            assert lane.worker_restarts == 0 and lane.crashes == 0, lane
    if not child:
        print("ok")


if __name__ == "__main__":
    main(sys.argv[1])
