"""How the supervisor words the failures it gives jobs when their worker
fails them: a death, a protocol violation, memory past a limit, workers that
cannot start, a supervisor that stops. Each message says what happened, to
which worker (pid, lane) and job, and what likely caused it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from procq._core.dispatch import UNSTARTED_DEATHS_TO_FAIL
from procq._core.entries import Entry, LaneState, WorkerSlot
from procq._model.job import format_size
from procq._model.values import Failure, FailureKind
from procq._system.processes import describe_exit
from procq._worker.unguarded import EXIT_CODE as UNGUARDED_EXIT
from procq._worker.unguarded import message as unguarded_message

__all__ = [
    "crash_failure",
    "exit_failure",
    "memory_failure",
    "protocol_failure",
    "sandbox_memory_failure",
    "start_failure",
    "stopped_failure",
    "unstarted_failure",
]


def exit_failure(exitcode: int | None, who: str, pid: int | None, then: str = "") -> Failure:
    """The failure of a job whose process (``who``, the subject of the
    sentence) ended with ``exitcode``: "timeout" for SIGXCPU (its CPU limit),
    else "crashed", with the signal or exit code in words."""
    sig, how, cause = describe_exit(exitcode)
    explained = "" if not cause else f": {cause}" if sig else f" ({cause})"
    kind: FailureKind = "timeout" if sig == "SIGXCPU" else "crashed"
    return Failure(kind, f"{who} {how}{explained}{then}", exitcode=exitcode, signal=sig, pid=pid)


def crash_failure(worker: WorkerSlot, exitcode: int | None) -> tuple[Callable[[Entry, bool], Failure], str | None, str]:
    """For a worker that died with ``exitcode``: the failure of the job it
    held (``crash(entry, started)``), its signal's name (None: it exited) and
    what happened, in words."""
    sig, how, _ = describe_exit(exitcode)
    who = f"worker process {worker.pid} (lane {worker.lane.name!r})"

    def crash(entry: Entry, started: bool) -> Failure:
        if started:
            return exit_failure(exitcode, who, worker.pid, f", while running job {entry.key!r}")
        return unstarted_failure(entry, exitcode, who, worker.pid)

    return crash, sig, how


def unstarted_failure(entry: Entry, exitcode: int | None, who: str, pid: int | None) -> Failure:
    """The failure of a job whose workers kept dying before they started it
    (``who``: the last of them, or the job's own process)."""
    failure = exit_failure(
        exitcode,
        who,
        pid,
        f" before it started job {entry.key!r}; {UNSTARTED_DEATHS_TO_FAIL} workers in a row died before "
        "starting it, so it failed rather than wait for one that lives (what kills them is not the job: "
        "look for what ends the lane's processes from outside, or for a lane that cannot run)",
    )
    return replace(failure, kind="crashed")


def protocol_failure(worker: WorkerSlot, entry: Entry, what: str) -> Failure:
    return Failure(
        "protocol",
        f"the worker (pid {worker.pid}, lane {worker.lane.name!r}) running job {entry.key!r} broke procq's "
        f"protocol with {what}; the job failed and the worker was replaced",
        pid=worker.pid,
    )


def memory_failure(worker: WorkerSlot, entry: Entry, limit: int, used: int) -> Failure:
    return Failure(
        "memory",
        f"job {entry.key!r} went over its memory_limit of {format_size(limit)} (its process tree "
        f"held {format_size(used)} more than the idle worker); its worker (pid {worker.pid}) and "
        "that process's tree were killed",
        pid=worker.pid,
    )


def sandbox_memory_failure(worker: WorkerSlot, entry: Entry, exitcode: int) -> Failure:
    sig, _, _ = describe_exit(exitcode)
    return Failure(
        "memory",
        f"job {entry.key!r} went over its sandbox's max_memory: the kernel killed its process "
        f"({sig or f'exit code {exitcode}'}) in the memory cgroup of worker {worker.pid} (lane {worker.lane.name!r}); "
        "the worker stays",
        exitcode=exitcode,
        signal=sig,
        pid=worker.pid,
    )


def start_failure(lane: LaneState, failures: int, how: str, exitcode: int | None = None) -> Callable[[Entry], Failure]:
    """The failure of a job waiting in a lane whose workers keep dying as they
    start (``exitcode``: the last one's; ``unguarded.EXIT_CODE`` says why)."""

    def failure(entry: Entry) -> Failure:
        if exitcode == UNGUARDED_EXIT:
            return Failure("crashed", f"job {entry.key!r} could not run: {unguarded_message()}")
        return Failure(
            "crashed",
            f"job {entry.key!r} could not run: the workers of lane {lane.name!r} keep dying while "
            f"they start ({failures} in a row; the last {how}). Their stderr says why; often the "
            "main module fails when a worker imports it (guard it with if __name__ == '__main__')"
            + (", or the lane's initializer ends the process" if lane.spec.initializer is not None else ""),
        )

    return failure


def stopped_failure(entry: Entry, started: bool = True) -> Failure:
    return Failure("cancelled", f"job {entry.key!r} was cancelled: the queue's supervisor stopped")
