"""Chaos: thousands of jobs across every way a job can end, pushed from several
threads at once with duplicates, batches and random cancels; then a check that
procq kept every promise.

    python -m bench.chaos                       # 2,500 jobs, as the test suite runs it
    python -m bench.chaos --jobs 50000 --seed 7 # the long setting

What is checked once every pushed job has ended and the queue is closed:

- every push was answered (``Queued``, ``InFlight`` or ``Cached``) and every
  handle resolved, in a bounded time;
- no key is stuck: each one pushed is ``Completed`` or ``Failed``;
- a completed key pushed again answers ``Cached`` with its output;
- no work ran twice behind the caller's back: a key ran at most once per fresh
  claim (``Queued`` answer), and exactly once where it was claimed once and
  completed; eight threads racing one key get one execution and eight equal
  answers;
- each job ended the way its kind must (a segfault "crashed", a hog "memory", ...),
  unless a random cancel got to it first ("cancelled"), and every failure kind
  was seen;
- the stats agree: nothing pending or processing, completed + failed = the keys
  held, and the lanes' settled counts = the fresh claims;
- a large job's output is its argument, byte for byte;
- the core's invariants hold, and no worker process is alive after ``close``,
  nor any shared-memory segment of the queue's (``procq._wire.shm``) left;
- blame is exact under kills from outside: a killer thread SIGKILLs random
  workers while the jobs are pushed (first stopping each with SIGSTOP, so
  that what the supervisor says it runs is what it runs). A job may fail
  "crashed" by a worker killed busy; no job fails by one killed idle.

A violation raises ``ChaosFailed`` listing them all.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import random
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from bench import chaos_jobs as cj
from procq import Cached, Completed, Failed, InFlight, Job, JobFailed, Lane, ProcQueue, Queued, Retry
from procq._core.entries import WorkerLife
from procq._wire.shm import SHM_DIR, segment_prefix

#: How each kind of job must end (None: it completes), and how often it is drawn.
KINDS: dict[str, tuple[str | None, int]] = {
    "ok": (None, 60),
    "flaky": (None, 4),  # fails once, then its Retry runs it again
    "untrusted": (None, 3),
    "raises": ("error", 6),
    "unpicklable": ("error", 2),
    "bad_unpickle": ("error", 2),
    "segfault": ("crashed", 2),
    "sigkill": ("crashed", 2),
    "exit": ("crashed", 1),
    "timeout": ("timeout", 1),
    "memory": ("memory", 2),
    "protocol": ("protocol", 1),
    "cancel": ("cancelled", 3),
    "large": (None, 3),  # a large argument and result, through shared memory
    "large_sigkill": ("crashed", 2),  # killed holding a large argument
}
#: The size of a large job's argument (and result): past procq._wire.oob.OOB_BYTES.
LARGE = 1 << 20
WAIT = 120.0  # the bound on every wait for an answer


class ChaosFailed(AssertionError):
    """procq broke a promise under chaos (the message lists every violation)."""


@dataclass
class Ledger:
    """What the pushers saw, shared between their threads under ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    jobs: dict[str, Job[Any]] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    queued: collections.Counter[str] = field(default_factory=collections.Counter)
    answers: collections.Counter[str] = field(default_factory=collections.Counter)
    handles: list[Any] = field(default_factory=list)
    cancelled: set[str] = field(default_factory=set)  # keys a random cancel hit
    errors: list[str] = field(default_factory=list)

    def note(self, key: str, outcome: Any) -> None:
        with self.lock:
            self.answers[type(outcome).__name__] += 1
            if isinstance(outcome, Queued):
                self.queued[key] += 1
            if isinstance(outcome, (Queued, InFlight)):
                self.handles.append(outcome.handle)
            elif not isinstance(outcome, Cached):
                self.errors.append(f"push of {key!r} answered {outcome!r}")


def _make_job(kind: str, i: int, work: str) -> Job[Any]:
    key = f"{kind}:{i}"
    log = os.path.join(work, "runs")
    lane = "io" if i % 2 else "cpu"
    if kind == "ok":
        return Job(key, cj.ok, args=(log, key), lane=lane)
    if kind == "flaky":
        marker = os.path.join(work, f"flaky-{i}")
        return Job(key, cj.flaky, args=(log, key, marker), lane=lane, retry=Retry(attempts=3, backoff=0.01))
    if kind == "untrusted":
        return Job(key, cj.ok, args=(log, key), lane="sandbox")
    if kind == "protocol":
        return Job(key, cj.big, args=(1 << 17,), lane="sandbox")
    if kind == "timeout":
        return Job(key, cj.sleep, args=(30.0,), lane=lane, timeout=0.2)
    if kind == "memory":
        return Job(key, cj.hog, args=(400,), lane=lane, memory_limit="64M")
    if kind == "cancel":
        return Job(key, cj.sleep, args=(30.0,), lane=lane, timeout=10.0)
    if kind == "large":
        return Job(key, cj.echo, args=(key.encode().ljust(LARGE, b"."),), lane=lane)
    if kind == "large_sigkill":
        return Job(key, cj.sigkill_holding, args=(bytes(LARGE),), lane=lane)
    if kind in ("raises", "bad_unpickle"):
        return Job(key, getattr(cj, kind), args=(key,), lane=lane)
    fn: Callable[[], Any] = {
        "segfault": cj.segfault,
        "sigkill": cj.sigkill,
        "exit": cj.exit_now,
        "unpicklable": cj.unpicklable,
    }[kind]
    return Job(key, fn, lane=lane)


def _pusher(q: ProcQueue, ledger: Ledger, plan: list[tuple[str, int]], work: str, seed: int) -> None:
    rnd = random.Random(seed)
    i = 0
    while i < len(plan):
        batch: list[Job[Any]] = []
        for _ in range(rnd.choice((1, 1, 1, 4, 8))):
            if i >= len(plan):
                break
            kind, n = plan[i]
            i += 1
            with ledger.lock:
                known = list(ledger.jobs) if rnd.random() < 0.25 and ledger.jobs else None
            if known:  # a duplicate: the very job some key was pushed with
                key = rnd.choice(known)
                job = ledger.jobs[key]
            else:
                job = _make_job(kind, n, work)
                with ledger.lock:
                    ledger.jobs[job.key] = job
                    ledger.kinds[job.key] = kind
            batch.append(job)
        try:
            outcomes = q.push_all(batch) if len(batch) > 1 else [q.push(batch[0])]
        except Exception as e:  # a push must never fail under chaos
            with ledger.lock:
                ledger.errors.append(f"push of {[j.key for j in batch]} raised {e!r}")
            continue
        for job, outcome in zip(batch, outcomes, strict=True):
            ledger.note(job.key, outcome)
            if ledger.kinds[job.key] == "cancel":
                q.cancel(job.key)
        if rnd.random() < 0.05:  # a random cancel of any key, live or not
            with ledger.lock:
                victim = rnd.choice(list(ledger.jobs))
            if q.cancel(victim):
                with ledger.lock:
                    ledger.cancelled.add(victim)


@dataclass
class Kills:
    """The workers the killer thread ended, by whether they held a job."""

    idle: set[int] = field(default_factory=set)
    busy: set[int] = field(default_factory=set)


def _killer(q: ProcQueue, kills: Kills, stop: threading.Event, seed: int, most: int, idle: bool) -> None:
    """SIGKILL a random ready worker (``idle``: one that holds no job) every
    few tens of milliseconds, as an operator or the OOM killer would, at
    most ``most`` of them. Each is stopped first (SIGSTOP): from then on it
    starts nothing, so whether the supervisor has given it a job at that
    moment says whether the kill is of a busy or an idle worker."""
    rnd = random.Random(seed)
    core = q._core
    done = len(kills.idle) + len(kills.busy)
    while len(kills.idle) + len(kills.busy) - done < most and not stop.wait(rnd.uniform(0.02, 0.06)):
        with core.lock:
            ready = [
                w
                for lane in core.lanes.values()
                for w in lane.workers
                if w.life is WorkerLife.READY and not (idle and w.entry is not None)
            ]
            # (A pidfd, opened while the worker is ours and unreaped: its pid cannot be another's.)
            worker = rnd.choice(ready) if ready else None
            try:
                target = os.pidfd_open(worker.pid) if worker is not None else None
            except ProcessLookupError:
                target = None
        if worker is None or target is None:
            continue
        try:
            signal.pidfd_send_signal(target, signal.SIGSTOP)
            with core.lock:
                busy = worker.entry is not None or worker.life is not WorkerLife.READY
            if not busy:
                # Stopped idle, it can start nothing: wait (briefly) for the
                # supervisor to give it a job, which the kill must then not fail.
                handed = time.monotonic() + 0.2
                while worker.entry is None and time.monotonic() < handed and not stop.wait(0.002):
                    pass
            signal.pidfd_send_signal(target, signal.SIGKILL)
            (kills.busy if busy else kills.idle).add(worker.pid)
        except ProcessLookupError:
            pass  # it had died meanwhile (its job's time limit, say): not this thread's kill
        finally:
            os.close(target)


def _trickle(q: ProcQueue, ledger: Ledger, work: str, first: int, count: int) -> None:
    """Push ``count`` plain jobs one at a time, each waited for: the workers
    are idle between them, and the killer thread ends idle ones (whose next
    job must then run elsewhere, not fail)."""
    for n in range(first, first + count):
        job = _make_job("ok", n, work)
        with ledger.lock:
            ledger.jobs[job.key] = job
            ledger.kinds[job.key] = "ok"
        outcome = q.push(job)
        ledger.note(job.key, outcome)
        if isinstance(outcome, (Queued, InFlight)):
            with contextlib.suppress(JobFailed, TimeoutError):  # (checked with the rest)
                outcome.handle.result(timeout=WAIT)


def _race(q: ProcQueue, work: str, rounds: int) -> list[str]:
    """Eight threads push one fresh key at once: one execution, eight equal answers."""
    problems = []
    log = os.path.join(work, "runs")
    for r in range(rounds):
        key = f"race:{r}"
        job = Job(key, cj.ok, args=(log, key))
        barrier = threading.Barrier(8)
        outs: list[Any] = []
        lock = threading.Lock()

        def push(job: Job[Any], barrier: threading.Barrier, outs: list[Any], lock: threading.Lock) -> None:
            barrier.wait(timeout=WAIT)
            out = q.push_and_wait(job, timeout=WAIT)
            with lock:
                outs.append(out)

        threads = [threading.Thread(target=push, args=(job, barrier, outs, lock)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=WAIT)
        if outs != [f"out:{key}"] * 8:
            problems.append(f"racing pushes of {key!r} answered {outs!r}")
    return problems


def _executions(work: str) -> collections.Counter[str]:
    path = os.path.join(work, "runs")
    if not os.path.exists(path):
        return collections.Counter()
    with open(path) as f:
        return collections.Counter(line.strip() for line in f if line.strip())


def _check(q: ProcQueue, ledger: Ledger, work: str, races: int, kills: Kills) -> list[str]:
    problems = list(ledger.errors)
    deadline = time.monotonic() + WAIT
    for handle in ledger.handles:
        try:
            handle.result(timeout=max(0.0, deadline - time.monotonic()))
        except JobFailed:
            pass
        except TimeoutError:
            problems.append(f"handle of {handle.key!r} never resolved")
    runs = _executions(work)
    seen_kinds: set[str] = set()
    for key, kind in ledger.kinds.items():
        state = q.state(key)
        if not isinstance(state, (Completed, Failed)):
            problems.append(f"{key!r} is stuck in {state!r}")
            continue
        expected, _ = KINDS[kind]
        got = None if isinstance(state, Completed) else state.failure.kind
        killer = None
        if isinstance(state, Failed):
            seen_kinds.add(state.failure.kind)
            killer = state.failure.pid if got == "crashed" else None
        if killer in kills.idle:
            problems.append(f"{key!r} ({kind}) was blamed for the death of worker {killer}, killed idle: {state!r}")
        elif got != expected and not (got == "cancelled" and key in ledger.cancelled) and killer not in kills.busy:
            problems.append(f"{key!r} ({kind}) ended {state!r}, expected {expected or 'completed'}")
        if kind == "large" and isinstance(state, Completed) and state.output != ledger.jobs[key].args[0]:
            problems.append(f"{key!r} came back other than it went ({len(state.output)} bytes)")
        if kind in ("ok", "untrusted") and isinstance(state, Completed):
            again = q.push(ledger.jobs[key])  # a completed key answers from its record
            if again != Cached(f"out:{key}"):
                problems.append(f"pushing completed {key!r} again answered {again!r}")
        if kind in ("ok", "untrusted"):
            claims = ledger.queued[key]
            if runs[key] > claims:
                problems.append(f"{key!r} ran {runs[key]} times for {claims} fresh claim(s)")
            if claims == 1 and isinstance(state, Completed) and runs[key] != 1:
                problems.append(f"{key!r} completed on one claim but ran {runs[key]} times")
    missing = {k for k, _ in KINDS.values() if k} - seen_kinds
    if missing:
        problems.append(f"no job ended with kind(s) {sorted(missing)}")
    stats = q.stats()
    if stats.pending or stats.processing:
        problems.append(f"after every handle resolved: {stats.pending} pending, {stats.processing} processing")
    held = len(q.keys())
    if stats.completed + stats.failed != held:
        problems.append(f"stats count {stats.completed} completed + {stats.failed} failed, but {held} keys are held")
    settled = sum(lane.completed + lane.failed for lane in stats.lanes.values())
    claims = sum(ledger.queued.values()) + races  # (each racing round claims its key once)
    if settled != claims:
        problems.append(f"the lanes settled {settled} jobs for {claims} fresh claims")
    try:
        q._check_invariants()
    except AssertionError as e:
        problems.append(f"core invariant broken: {e!r}")
    return problems


def run_chaos(jobs: int = 2500, seed: int = 0, threads: int = 4, races: int = 20, kills: int = 60) -> dict[str, Any]:
    """Run the chaos and check it; returns a summary, raises ``ChaosFailed``.
    ``kills``: at most this many workers SIGKILLed from outside."""
    rnd = random.Random(seed)
    names = list(KINDS)
    weights = [KINDS[k][1] for k in names]
    plan = [(rnd.choices(names, weights)[0], n) for n in range(jobs)]
    # Every kind at least once, whatever the draw.
    plan[: len(names)] = [(k, n) for n, k in enumerate(names)]
    started = time.monotonic()
    ledger = Ledger()
    sandbox = Lane(workers=2, trusted=False, max_result_bytes="64K")
    lanes: dict[str, int | Lane] = {"cpu": 2, "io": 2, "sandbox": sandbox}
    killed = Kills()
    with tempfile.TemporaryDirectory(prefix="procq-chaos-") as work:
        q = ProcQueue(lanes)
        pids: set[int] = set()
        stop = threading.Event()
        killer = threading.Thread(target=_killer, args=(q, killed, stop, seed, kills // 2, False))
        try:
            slices = [plan[i::threads] for i in range(threads)]
            pushers = [
                threading.Thread(target=_pusher, args=(q, ledger, part, work, seed * 100 + t))
                for t, part in enumerate(slices)
            ]
            for t in pushers:
                t.start()
            killer.start()
            while any(t.is_alive() for t in pushers):
                pids.update(q._worker_pids())
                for t in pushers:
                    t.join(timeout=0.05)
            stop.set()
            killer.join(timeout=WAIT)
            stop.clear()  # now idle workers, between jobs pushed one at a time
            killer = threading.Thread(target=_killer, args=(q, killed, stop, seed + 1, kills - kills // 2, True))
            killer.start()
            trickles = [
                threading.Thread(target=_trickle, args=(q, ledger, work, jobs + 1000 * t, 150)) for t in range(2)
            ]
            for t in trickles:
                t.start()
            for t in trickles:
                while t.is_alive():
                    pids.update(q._worker_pids())
                    t.join(timeout=0.05)
            stop.set()
            killer.join(timeout=WAIT)
            problems = _race(q, work, races)
            problems += _check(q, ledger, work, races, killed)
            pids.update(q._worker_pids())
        finally:
            q.close()
        alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
        if alive:
            problems.append(f"worker processes alive after close: {alive}")
        left = [name for name in os.listdir(SHM_DIR) if name.startswith(segment_prefix())]
        if left:
            problems.append(f"shared-memory segments left after close: {left}")
    summary = {
        "jobs": jobs,
        "keys": len(ledger.kinds),
        "answers": dict(ledger.answers),
        "fresh claims": sum(ledger.queued.values()),
        "random cancels": len(ledger.cancelled),
        "workers killed idle": len(killed.idle),
        "workers killed busy": len(killed.busy),
        "seconds": round(time.monotonic() - started, 1),
    }
    if problems:
        raise ChaosFailed(f"{len(problems)} violation(s) under chaos ({summary}):\n  " + "\n  ".join(problems[:50]))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2500, help="jobs to push (default 2,500)")
    parser.add_argument("--seed", type=int, default=0, help="the random plan's seed")
    parser.add_argument("--threads", type=int, default=4, help="pushing threads")
    parser.add_argument("--kills", type=int, default=60, help="workers to SIGKILL from outside, at most")
    args = parser.parse_args()
    summary = run_chaos(args.jobs, args.seed, args.threads, kills=args.kills)
    print("chaos: every promise held:", summary)


if __name__ == "__main__":
    main()
