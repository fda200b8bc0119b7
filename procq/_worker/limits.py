"""A trusted worker's per-job limits, set around each job (``Limits``), and
the address-space limit a job's memory limit comes to (``address_limit``,
also set by an untrusted job's process for its memory limit)."""

from __future__ import annotations

import os

__all__ = ["Limits", "address_limit", "address_space"]


class Limits:
    """Per-job limits set around each job: the address-space limit for the
    job's ``memory_limit`` and the CPU-time limit for ``rlimits["cpu"]``.

    Both are soft limits, raised again after the job, because a worker runs
    many jobs: the memory limit counts what the job maps on top of the idle
    worker, the CPU limit the CPU time the job uses. (A job could raise a
    soft limit itself; the supervisor's own watch on memory and wall-clock
    ``timeout`` are what hold code that does.)
    """

    def __init__(self, cpu: int | None) -> None:
        self.cpu = cpu
        self._as_set = False
        self._cpu_set = False

    def apply(self, memory_limit: int | None) -> None:
        if memory_limit is None and self.cpu is None:
            return
        import resource

        if memory_limit is not None:
            soft, hard = address_limit(memory_limit)
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
            self._as_set = True
        if self.cpu is not None:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            used = int(usage.ru_utime + usage.ru_stime) + 1
            _, hard = resource.getrlimit(resource.RLIMIT_CPU)
            resource.setrlimit(resource.RLIMIT_CPU, (used + self.cpu, hard))
            self._cpu_set = True

    def lift(self) -> None:
        if not (self._as_set or self._cpu_set):
            return
        import resource

        if self._as_set:
            _, hard = resource.getrlimit(resource.RLIMIT_AS)
            resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
            self._as_set = False
        if self._cpu_set:
            _, hard = resource.getrlimit(resource.RLIMIT_CPU)
            resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
            self._cpu_set = False


def address_space() -> int:
    """This process's mapped address space, in bytes."""
    with open("/proc/self/statm", "rb") as f:
        pages = int(f.read().split()[0])
    return pages * os.sysconf("SC_PAGE_SIZE")


def address_limit(memory_limit: int) -> tuple[int, int]:
    """The address space a job of ``memory_limit`` bytes may map on top of
    this process's (never past the hard limit), and the hard limit now."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = address_space() + memory_limit
    return (limit if hard == resource.RLIM_INFINITY else min(limit, hard)), hard
