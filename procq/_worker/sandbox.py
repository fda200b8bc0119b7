"""A sandboxed lane's worker side: its namespaces (once), and each job's
private temporary directory, bounds and confinement (see
``_system.sandbox_linux``; the bounds' plan is ``_system.sandbox_bounds``'s)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from typing import Any

from procq._system import seccomp as _seccomp
from procq._system.cgroups import JobCgroup
from procq._system.egress_bridge import PORT, BridgeClosed, hand_over, proxy_env
from procq._system.privileges import set_pdeathsig
from procq._system.sandbox_linux import SHM, Admission, confine, default_reads, isolate, reap_leftovers

__all__ = ["WorkerSandbox", "enter"]


def _under_any(path: str, parents: list[str]) -> bool:
    real = os.path.realpath(path)
    for parent in parents:
        p = os.path.realpath(parent).rstrip("/") + "/"
        if real == p[:-1] or real.startswith(p):
            return True
    return False


class WorkerSandbox:
    """Made by an untrusted worker whose lane has a sandbox, before it drops
    its privileges: with the ``namespaces`` part, the worker is then PID 1 of
    its own namespaces, with the view for its jobs as its root."""

    def __init__(self, config: dict[str, Any], import_path: list[str], keep: set[int]) -> None:
        parts = set(config["parts"])
        self.abi: int = config["landlock"]
        self.network: bool = config["network"]
        # With an allow-list: the bridge to the supervisor's egress proxy (see _system.egress_bridge).
        bridge: int | None = config.get("bridge")
        self.egress = bridge is not None
        self.reads: list[str] = [*config["read"], *default_reads(import_path, self.network or self.egress)]
        self.writes: list[str] = list(config["write"])
        self.namespaces = "namespaces" in parts
        wants_filter = "privileges" in parts or ("network" in parts and not self.network)
        self.filter = _seccomp.program(self.network or self.egress) if wants_filter else None
        bounds = config.get("bounds") or {}
        #: RLIMIT_NPROC for each job, counted in its user namespace (None: a pids cgroup, or no bound).
        self.nproc: int | None = bounds.get("nproc")
        # The worker's cgroup, whose files are opened here: they are not in the view.
        dirs = bounds.get("cgroup_dirs")
        memory_version = (bounds.get("cgroups") or {}).get("memory", [1])[0]
        self.cgroup = JobCgroup(dirs, memory_version) if dirs else None
        self._kills = 0
        #: The running (or last) job was killed by the kernel for its memory bound.
        self.memory_killed = False
        # The job's working directory: the worker's, if the job may read it; else its own temporary directory.
        cwd = os.getcwd()
        self.visible_cwd = _under_any(cwd, self.reads + self.writes)
        self.admission: Admission | None = None
        if self.namespaces:
            self.admission = isolate(
                self.reads,
                self.writes,
                self.network,
                cwd if self.visible_cwd else None,
                keep | ({bridge} if bridge is not None else set()),
                bounds.get("tmp_size"),
            )
            self.tmp_root = "/tmp"  # the view's own tmpfs, private to this worker
            if bridge is not None:
                hand_over(bridge)
        else:
            self.tmp_root = tempfile.gettempdir()

    def admit(self) -> bool:
        """Before each job: False if the process outside the namespaces, the
        one the supervisor knows as this worker, is gone (see ``Admission``)."""
        return self.admission is None or self.admission.admit()

    def job_dir(self) -> str:
        """A new private temporary directory for the next job (in the worker)."""
        if self.cgroup is not None:
            self._kills = self.cgroup.memory_kills()
        self.memory_killed = False
        return tempfile.mkdtemp(prefix="procq-job-", dir=self.tmp_root)

    def join(self) -> None:
        """In the job's process, first (while it still holds the worker's
        descriptors): into the worker's cgroup, under its bounds."""
        if self.cgroup is not None:
            self.cgroup.join()
        if self.nproc is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_NPROC, (self.nproc, self.nproc))

    def confine(self, tmp: str) -> None:
        """In the job's process, before job code runs."""
        os.environ["TMPDIR"] = tmp
        tempfile.tempdir = tmp
        if self.egress:
            os.environ.update(proxy_env())
        if not self.visible_cwd:
            os.chdir(tmp)
        writes = [*self.writes, tmp, SHM] if self.namespaces else [*self.writes, tmp]
        connect = (PORT,) if self.egress else ()
        confine(self.abi, self.reads, writes, self.namespaces, self.network, self.filter, connect)

    def after(self, tmp: str) -> None:
        """In the worker, once the job's process has exited: note whether the
        kernel killed it for its memory bound; end what it left running (with
        a PID namespace, all of it; without, what its cgroup holds), empty the
        view's /dev/shm and remove its temporary directory."""
        if self.cgroup is not None:
            self.memory_killed = self.cgroup.memory_kills() > self._kills
            if not self.namespaces:
                self.cgroup.end_leftovers()
        if self.namespaces:
            reap_leftovers()
            for name in os.listdir(SHM):  # the view's own: what the job left in shared memory
                _remove(os.path.join(SHM, name))
        _remove(tmp)


def enter(config: dict[str, Any], import_path: list[str], pipes: set[int]) -> WorkerSandbox:
    """The untrusted worker's sandbox, entered; a worker the kernel refuses
    exits with the reason on stderr and never takes a job."""
    try:
        sandbox = WorkerSandbox(config, import_path, pipes)
        worker = os.getppid()
        set_pdeathsig()  # in a PID namespace of its own now, under a process that waits for it
        if os.getppid() != worker:  # pragma: no cover - that process died first
            os._exit(1)
    except BridgeClosed:
        os._exit(1)  # the supervisor gave up on this worker: nobody to tell
    except OSError as exc:
        print(f"procq: a sandboxed worker could not enter its sandbox: {exc}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
    return sandbox


def _remove(path: str) -> None:
    """Remove ``path`` (a file or a tree), whatever modes the job gave what is in it."""
    if os.path.islink(path) or not os.path.isdir(path):
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            try:  # never through a symlink: the job chose where they point
                fd = os.open(os.path.join(root, name), os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                os.chmod(f"/proc/self/fd/{fd}", 0o700)
            except OSError:
                pass
            finally:
                os.close(fd)
    shutil.rmtree(path, ignore_errors=True)
