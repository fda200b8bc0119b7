"""``DaskLane``: a lane whose jobs run on a Dask cluster (``procq[dask]``).

A value like ``Lane``, and a ``Lane`` itself: the supervisor treats it as any
other lane (keys, capacity, retries, stats); only its workers differ. Its
``workers`` are slots, each holding at most one job on the cluster at a time
(see ``_cluster.channel``), so ``workers`` bounds how many of the lane's jobs are
on the cluster at once. On the cluster each job runs in a procq worker process
that the Dask task starts and supervises (see ``_cluster.remote``), never in the
Dask worker's own process.

The settings that act on a worker process (``timeout``, ``memory_limit``,
``max_jobs_per_worker``, ``max_worker_rss``, ``rlimits``, ``env``,
``inherit_env``, ``cwd``, ``kill_grace``) act on those far processes, and are
enforced there: a job's time limit counts from its start on the cluster, not
from the moment it was handed to Dask.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from procq._model.job import DEFAULT_CAPACITY, DEFAULT_RESULT_VALUES, Lane

__all__ = ["DaskLane"]


def _require_distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        raise ImportError(
            "a DaskLane needs the 'distributed' package: install procq with its dask extra, pip install 'procq[dask]'"
        ) from exc
    return distributed


@dataclass(frozen=True, init=False)
class DaskLane(Lane):
    """A lane whose jobs run on a Dask cluster.

    ``cluster`` is the scheduler's address (``"tcp://scheduler:8786"``) or a
    ``distributed.Client`` made by the caller (a synchronous one: procq
    drives it from its own threads). procq connects when the queue opens
    (waiting up to ``connect_timeout`` seconds) and closes its own client
    when the queue closes; a client given to it stays open.

    Every other argument means what it means for :class:`Lane`, applied on
    the Dask worker that runs the job: ``workers`` jobs at most on the
    cluster at once, ``capacity`` jobs waiting for them; each job in a procq
    worker process there, under ``timeout``, ``memory_limit``, ``rlimits``,
    ``env`` (``inherit_env``: start from the Dask worker's environment) and
    ``cwd`` (a directory on the Dask workers' machines). ``trusted=False`` is
    refused for now.

    The scheduler must be configured never to run a task again after its
    worker died (``distributed.scheduler.allowed-failures`` set to 0), so
    that a job whose Dask worker died fails once, as a local job whose worker
    died does, instead of running again behind procq's back: the queue
    refuses to open otherwise (see docs/cluster.md).
    """

    cluster: Any = None
    connect_timeout: float = 30.0

    #: Its workers are not processes of this machine (see ``Lane.remote``).
    remote: ClassVar[bool] = True

    def __init__(
        self,
        cluster: Any,
        *,
        workers: int = 1,
        capacity: int = DEFAULT_CAPACITY,
        timeout: float | None = None,
        memory_limit: int | str | None = None,
        max_jobs_per_worker: int | None = None,
        max_worker_rss: int | str | None = None,
        trusted: bool = True,
        max_result_bytes: int | str | None = None,
        rlimits: Mapping[str, int | str] | None = None,
        env: Mapping[str, str] | None = None,
        inherit_env: bool | None = None,
        cwd: str | os.PathLike[str] | None = None,
        kill_grace: float = 0.05,
        max_result_values: int = DEFAULT_RESULT_VALUES,
        connect_timeout: float = 30.0,
    ) -> None:
        if trusted is not True:
            raise ValueError(
                "a DaskLane cannot be untrusted (trusted=False) yet: its jobs' results come back "
                "through Dask, which unpickles them; use a local untrusted Lane for code you do not trust"
            )
        if isinstance(cluster, str):
            if not cluster:
                raise ValueError("DaskLane cluster must be a scheduler address or a distributed.Client, got ''")
            _require_distributed()
        else:
            distributed = _require_distributed()
            if not isinstance(cluster, distributed.Client):
                raise TypeError(
                    "DaskLane cluster must be a scheduler address (str) or a distributed.Client, "
                    f"got {type(cluster).__name__}"
                )
            if cluster.asynchronous:
                raise ValueError(
                    "DaskLane needs a synchronous distributed.Client (procq drives it from its own "
                    "threads), got one made with asynchronous=True"
                )
        if isinstance(connect_timeout, bool) or not isinstance(connect_timeout, (int, float)):
            raise TypeError(f"DaskLane connect_timeout must be a number of seconds, got {connect_timeout!r}")
        if not math.isfinite(connect_timeout) or connect_timeout <= 0:
            raise ValueError(f"DaskLane connect_timeout must be a positive number of seconds, got {connect_timeout!r}")
        if cwd is not None and not isinstance(cwd, (str, os.PathLike)):
            raise TypeError(f"lane cwd must be a path, got {type(cwd).__name__}")
        fields = {
            "workers": workers,
            "capacity": capacity,
            "timeout": timeout,
            "memory_limit": memory_limit,
            "max_jobs_per_worker": max_jobs_per_worker,
            "max_worker_rss": max_worker_rss,
            "trusted": True,
            "max_result_bytes": max_result_bytes,
            "rlimits": rlimits,
            "env": env,
            "inherit_env": inherit_env,
            "cwd": None,  # (checked below: it is a directory of the Dask workers' machines, not of this one)
            "kill_grace": kill_grace,
            "max_result_values": max_result_values,
            "cluster": cluster,
            "connect_timeout": float(connect_timeout),
        }
        for name, value in fields.items():
            object.__setattr__(self, name, value)
        self.__post_init__()
        if cwd is not None:
            path = os.fspath(cwd)
            if not isinstance(path, str) or not path or "\0" in path:
                raise ValueError(f"lane cwd must be a non-empty str path without NUL, got {path!r}")
            object.__setattr__(self, "cwd", path)

    @property
    def address(self) -> str:
        """The scheduler's address, for messages."""
        if isinstance(self.cluster, str):
            return self.cluster
        return str(getattr(self.cluster, "scheduler", None) and self.cluster.scheduler.address)
