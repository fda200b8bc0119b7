"""Programs the store tests run in processes of their own:
``python tests/store_program.py <command> <url> ...`` (see each function)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

import jobs
import store_jobs

from procq import Cached, Job, JobFailed, ProcQueue
from procq._stores.base import Store
from procq._stores.urls import open_store


def store(url: str, lease: float) -> Store:
    s = open_store(url)
    s.lease = lease
    return s


def race(url: str, key: str, log: str, threads: str, out: str) -> None:
    """``threads`` threads push ``key`` at once; their answers go to ``out`` as JSON."""
    answers: list[Any] = []
    with ProcQueue(1, store=store(url, 10.0)) as q:
        barrier = threading.Barrier(int(threads))

        def push() -> None:
            barrier.wait(timeout=20)
            answers.append(q.push_and_wait(Job(key, store_jobs.counted, args=(log, "the value", 0.2)), timeout=30))

        ts = [threading.Thread(target=push) for _ in range(int(threads))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=40)
    with open(out, "w") as f:
        json.dump(answers, f)


def hold(url: str, key: str, started: str, go: str, lease: str) -> None:
    """Hold ``key`` with a job gated by the FIFOs ``started`` / ``go``, then wait (to be killed)."""
    with ProcQueue(1, store=store(url, float(lease))) as q:
        q.push_and_wait(Job(key, jobs.signal_and_wait, args=(started, go)), timeout=60)


def stage(url: str, log: str, n: str, crash_after: str) -> None:
    """A pipeline stage: keys stage:0 .. stage:n-1 in turn; SIGKILLs itself after key ``crash_after``."""
    with ProcQueue(1, store=store(url, 1.0)) as q:
        for i in range(int(n)):
            q.push_and_wait(Job(f"stage:{i}", store_jobs.counted, args=(log, i)), timeout=30)
            if i == int(crash_after):
                os.kill(os.getpid(), signal.SIGKILL)


def work(url: str, log: str, n: str, seconds: str, lease: str) -> None:
    """Push keys work:0 .. work:n-1 (jobs of ``seconds``), say "claimed", then get every
    output, pushing again any key whose holder was interrupted; print the outputs as JSON."""
    with ProcQueue(2, store=store(url, float(lease))) as q:
        batch = [Job(f"work:{i}", store_jobs.counted, args=(log, i, float(seconds))) for i in range(int(n))]
        q.push_all(batch)
        print("claimed", flush=True)
        outputs: dict[int, Any] = {}
        for _ in range(20):
            for i, job in enumerate(batch):
                if i not in outputs:
                    try:
                        outputs[i] = q.push_and_wait(job, timeout=30)
                    except JobFailed as exc:
                        if exc.failure.kind != "interrupted":
                            raise
        print(json.dumps(outputs), flush=True)


def later(url: str, key: str, log: str) -> None:
    """Push ``key`` to run an hour from now, say "claimed", then print its output once it ran."""
    with ProcQueue(1, store=store(url, 10.0)) as q:
        pushed = q.push(Job(key, store_jobs.counted, args=(log, "ran"), not_before=3600.0))
        print("claimed", flush=True)
        print(pushed.handle.result(timeout=60), flush=True)  # type: ignore[union-attr]


def _job(log: str, key: str) -> Job[Any]:
    """A key's one job (its work, from its name: every push of a key is the same job)."""
    return Job(key, store_jobs.stamped, args=(log, key, 0.1 if key.endswith("slow") else 0.0))


def serve(url: str, log: str) -> None:
    """Run commands from stdin, each in a thread of its own, answering each as a
    JSON line: ``push`` a key (``repeats`` > 1: in one ``push_all``), push it
    again until its first handle is done, and answer every outcome (each
    handle's output or failure kind); ``cancel`` a key, ``after`` seconds.
    Says "ready" first."""
    said = threading.Lock()

    def say(answer: dict[str, Any]) -> None:
        with said:
            print(json.dumps(answer), flush=True)

    def outcome(pushed: Any) -> list[Any]:
        if isinstance(pushed, Cached):
            return ["cached", pushed.output]
        try:
            return [type(pushed).__name__, pushed.handle.result(timeout=60)]
        except JobFailed as exc:
            return [type(pushed).__name__ + " failed", exc.failure.kind]

    def run(q: ProcQueue, command: dict[str, Any]) -> None:
        try:
            job = _job(log, command["key"])
            if command["op"] == "cancel":
                time.sleep(command["after"])  # (when in the job's life the cancel comes: the command's choice)
                say({"id": command["id"], "cancelled": q.cancel(job.key)})
                return
            first = q.push_all([job] * command["repeats"])
            pushed = list(first)
            while not all(p.handle.done() for p in first if not isinstance(p, Cached)) and len(pushed) < 500:
                pushed.append(q.push(job))
            say({"id": command["id"], "outs": [outcome(p) for p in pushed]})
        except BaseException as exc:
            say({"id": command["id"], "error": repr(exc)})

    with ProcQueue(2, store=store(url, 10.0)) as q:
        print("ready", flush=True)
        threads = []
        for line in sys.stdin:
            t = threading.Thread(target=run, args=(q, json.loads(line)))
            t.start()
            threads.append(t)
        for t in threads:
            t.join()


if __name__ == "__main__":
    commands = {"race": race, "hold": hold, "stage": stage, "work": work, "later": later, "serve": serve}
    commands[sys.argv[1]](*sys.argv[2:])
