"""Workers that die while they start: no job is lost to them, and none waits forever."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# A script whose workers cannot start: each worker imports the main module (as
# __mp_main__) and this one raises when that happens.
SCRIPT = textwrap.dedent(
    """
    import sys
    if __name__ == "__mp_main__":
        raise RuntimeError("this module refuses to be imported by a worker")

    from procq import Job, JobFailed, ProcQueue

    if __name__ == "__main__":
        with ProcQueue(lanes=1, start_method=sys.argv[1]) as q:
            try:
                q.push_and_wait(Job("doomed", abs, args=(-1,)), timeout=30)
            except JobFailed as e:
                print("KIND", e.failure.kind)
                print("MESSAGE", e.failure.message)
                stats = q.stats().lanes["default"]
                print("STATS", stats.crashes, stats.worker_restarts >= 2)
            else:
                print("RAN")
    """
)


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_jobs_fail_clearly_when_workers_keep_dying_at_start(tmp_path: Path, method: str) -> None:
    script = tmp_path / "refuses.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), method], capture_output=True, text=True, timeout=50, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert lines["KIND"] == "crashed"
    assert (
        "the workers of lane 'default' keep dying while they start (3 in a row; the last exited with code 1)"
        in lines["MESSAGE"]
    )
    assert "if __name__ == '__main__'" in lines["MESSAGE"]
    # Dying at start is no job's crash; the lane kept trying to restart its worker.
    assert lines["STATS"] == "0 True"
    assert "this module refuses to be imported by a worker" in proc.stderr


# Modules the program asked the forkserver to preload are kept beside procq's:
# a worker forked from the server has them before any job imports them.
PRELOADED = textwrap.dedent(
    """
    import multiprocessing
    import sys

    from procq import Job, ProcQueue


    def loaded():
        return sorted(m for m in ("wave", "colorsys") if m in sys.modules)


    if __name__ == "__main__":
        multiprocessing.set_forkserver_preload(["wave"])
        with ProcQueue(lanes=1) as q:
            print(q.push_and_wait(Job("loaded", loaded), timeout=30))
    """
)


def test_modules_the_program_preloads_are_in_every_worker(tmp_path: Path) -> None:
    script = tmp_path / "preloads.py"
    script.write_text(PRELOADED)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=50, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['wave']"  # preloaded; colorsys, asked by no one, is not there


# Libraries that procq uses only on demand stay out of a plain program and of
# its workers: each one a forked worker carries costs it in every fork and exit.
LEAN = textwrap.dedent(
    """
    import sys

    from procq import Job, ProcQueue

    HEAVY = ("asyncio", "ssl", "hashlib", "_hashlib", "concurrent.futures")


    def loaded(*_):
        return sorted(m for m in HEAVY if m in sys.modules)


    if __name__ == "__main__":
        with ProcQueue(lanes=1) as q:
            print(q.push_and_wait(Job("worker", loaded), timeout=30))
            # A list argument: the key's fingerprint digests it (blake2b).
            print(q.push_and_wait(Job("digest", loaded, args=([1, "a"],)), timeout=30))
            print(sorted(q.map(abs, [-1, -2])))
        print(loaded())
    """
)


def test_asyncio_and_openssl_are_not_loaded_unless_used(tmp_path: Path) -> None:
    script = tmp_path / "lean.py"
    script.write_text(LEAN)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=50, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[]", "[]", "[1, 2]", "[]"]
