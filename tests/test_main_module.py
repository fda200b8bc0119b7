"""The program's main module under the forkserver: imported once, in the
server, with the program's ``sys.argv``, never again by a worker; what it
defines still unpickles in every worker; a program with no main file, or
one whose main module cannot be imported there, still runs its jobs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from procq._api.config import main_request

ROOT = str(Path(__file__).resolve().parent.parent)

# Each import of the script appends a line to the file named by COUNT_FILE:
# its __name__ and its arguments. Its jobs: one that kills its worker, one that
# says where it ran, one that takes an instance of a class the script defines.
SCRIPT = textwrap.dedent(
    """
    import os
    import sys

    with open(os.environ["COUNT_FILE"], "a") as f:
        f.write(f"{__name__} {' '.join(sys.argv[1:])}\\n")

    from procq import Job, JobFailed, ProcQueue


    class Box:
        def __init__(self, value):
            self.value = value


    def die():
        os.kill(os.getpid(), 9)


    def unbox(box):
        import __main__

        return box.value * 2, type(box).__module__, __main__.__name__, sys.argv[1:], os.getpid()


    if __name__ == "__main__":
        crashes = int(sys.argv[1])
        with ProcQueue(lanes=2) as q:
            pids = set()
            for i in range(crashes):
                try:
                    q.push_and_wait(Job(f"die{i}", die), timeout=30)
                except JobFailed as e:
                    assert e.failure.kind == "crashed", e.failure
                    pids.add(e.failure.pid)
            value, module, main, argv, pid = q.push_and_wait(Job("unbox", unbox, args=(Box(21),)), timeout=30)
            stats = q.stats().lanes["default"]
            print("RESULT", value, module, main, " ".join(argv), pid not in pids, stats.worker_restarts)
    """
)


def _interpreters() -> list[str]:
    """This Python, every interpreter named in ``PROCQ_TEST_PYTHONS`` (paths,
    separated by ``os.pathsep``: ``.ci/run`` makes a venv with procq's
    dependencies for each other CPython 3.10-3.13 it finds), and every other
    ``python3.10``-``python3.13`` on PATH that can import those dependencies."""
    found = [sys.executable]
    seen = {os.path.realpath(sys.executable)}
    named = [p for p in os.environ.get("PROCQ_TEST_PYTHONS", "").split(os.pathsep) if p]
    on_path = [exe for minor in (10, 11, 12, 13) if (exe := shutil.which(f"python3.{minor}")) is not None]
    for exe in named + on_path:
        if os.path.realpath(exe) in seen:
            continue
        probe = subprocess.run([exe, "-c", "import cloudpickle, psutil"], capture_output=True, timeout=30)
        if probe.returncode == 0 or exe in named:  # (a named one that cannot import them fails its test)
            found.append(exe)
            seen.add(os.path.realpath(exe))
    return found


#: The interpreters the programs below run under (this one first).
PYTHONS = _interpreters()


def _run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = dict(os.environ, PYTHONPATH=ROOT, COUNT_FILE=str(tmp_path / "count.txt"), **env)
    return subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=environ)


def _imports(tmp_path: Path) -> list[str]:
    return (tmp_path / "count.txt").read_text().splitlines()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("python", PYTHONS)
def test_the_main_script_runs_once_for_every_worker_start(tmp_path: Path, python: str) -> None:
    """Six crashes: eight worker starts (two first, six replacements), and the
    script's top level ran twice: as the program, and once in the forkserver,
    with the program's arguments."""
    script = tmp_path / "counted.py"
    script.write_text(SCRIPT)
    proc = _run([python, str(script), "6", "--flag"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "RESULT 42 __mp_main__ __mp_main__ 6 --flag True 6" in proc.stdout, proc.stdout
    assert _imports(tmp_path) == ["__main__ 6 --flag", "__mp_main__ 6 --flag"]


@pytest.mark.parametrize("python", PYTHONS)
def test_a_main_module_run_with_dash_m_runs_once(tmp_path: Path, python: str) -> None:
    """``python -m package.module``: imported once in the server, by name."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "counted.py").write_text(SCRIPT)
    proc = _run([python, "-m", "pkg.counted", "3"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "RESULT 42 __mp_main__ __mp_main__ 3 True 3" in proc.stdout, proc.stdout
    assert _imports(tmp_path) == ["__main__ 3", "__mp_main__ 3"]


# A program with no main file: its jobs run, and a DEBUG line says why no main module is preloaded.
DASH_C = textwrap.dedent(
    """
    import logging, os
    logging.basicConfig(level=logging.DEBUG, format="%(name)s %(levelname)s %(message)s")
    from procq import Job, JobFailed, ProcQueue
    def double(x):
        return 2 * x
    with ProcQueue(lanes=1) as q:
        try:
            q.push_and_wait(Job("die", os.kill, args=(0, 0)), timeout=30)
            q.push_and_wait(Job("kill", lambda: os.kill(os.getpid(), 9)), timeout=30)
        except JobFailed as e:
            print("CRASHED", e.failure.kind)
        print("RESULT", q.push_and_wait(Job("double", double, args=(21,)), timeout=30))
    """
)


@pytest.mark.parametrize("python", PYTHONS)
def test_a_program_run_with_dash_c_runs_its_jobs(tmp_path: Path, python: str) -> None:
    proc = _run([python, "-c", DASH_C], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["CRASHED crashed", "RESULT 42"]
    assert (
        "procq.worker DEBUG the forkserver does not import the main module: the program has no main file" in proc.stderr
    )


@pytest.mark.parametrize("python", PYTHONS)
def test_a_script_read_from_stdin_runs_its_jobs(tmp_path: Path, python: str) -> None:
    """``python - < script.py``: its ``__file__`` is ``<stdin>``, no file a
    worker could run (each would die as it starts); the workers run none."""
    proc = subprocess.run(
        [python, "-"], input=DASH_C, capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["CRASHED crashed", "RESULT 42"]
    assert "FileNotFoundError" not in proc.stderr
    assert (
        "procq.worker DEBUG the forkserver does not import the main module: the program has no main file" in proc.stderr
    )


# A script whose import fails in the forkserver only: its first import as
# __mp_main__ raises (and leaves a mark), the next ones (each worker's) do not.
FAILS_ONCE = textwrap.dedent(
    """
    import logging
    import os
    import sys

    with open(os.environ["COUNT_FILE"], "a") as f:
        f.write(f"{__name__}\\n")
    if __name__ == "__mp_main__":
        mark = os.path.join(os.path.dirname(os.environ["COUNT_FILE"]), "failed-once")
        if not os.path.exists(mark):
            open(mark, "w").close()
            raise RuntimeError("not this time")

    from procq import Job, JobFailed, ProcQueue


    def triple(x):
        return 3 * x


    if __name__ == "__main__":
        logging.basicConfig(level=logging.DEBUG, format="%(name)s %(levelname)s %(message)s")
        with ProcQueue(lanes=1) as q:
            try:
                q.push_and_wait(Job("kill", os.kill, args=(0, 0)), timeout=30)
                q.push_and_wait(Job("die", lambda: os.kill(os.getpid(), 9)), timeout=30)
            except JobFailed as e:
                print("CRASHED", e.failure.kind)
            print("RESULT", q.push_and_wait(Job("triple", triple, args=(14,)), timeout=30))
    """
)


@pytest.mark.parametrize("python", PYTHONS)
def test_a_main_module_that_fails_in_the_forkserver_is_imported_by_each_worker(tmp_path: Path, python: str) -> None:
    script = tmp_path / "fails_once.py"
    script.write_text(FAILS_ONCE)
    proc = _run([python, str(script)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["CRASHED crashed", "RESULT 42"]
    # The program, the server's failed try, then each of the two workers (the first and its replacement).
    assert _imports(tmp_path) == ["__main__", "__mp_main__", "__mp_main__", "__mp_main__"]
    assert (
        f"procq.worker DEBUG the forkserver does not import the main module: importing {script} raised "
        "RuntimeError: not this time; each worker imports it again as it starts"
    ) in proc.stderr
    assert proc.stderr.count("does not import the main module") == 1  # once, not once per worker


def test_the_main_request_carries_what_spawn_would_pass() -> None:
    """The name on the forkserver's preload list: the main file (or module
    name), ``sys.argv`` and ``sys.path``, as ``multiprocessing.spawn`` gives a child."""
    import json
    from multiprocessing import spawn

    name = main_request()
    data = spawn.get_preparation_data("x")
    if "init_main_from_path" not in data and "init_main_from_name" not in data:
        assert name is None
        return
    if data.get("init_main_from_name", "").endswith("__main__"):
        assert name is None  # python -m pytest: a package's __main__, which spawn never runs again
        return
    assert name is not None and name.startswith("procq._worker.forkserver_main.main_")
    request = json.loads(bytes.fromhex(name.rsplit(".", 1)[1][len("main_") :]))
    assert request["argv"] == sys.argv
    assert request["path"] == data["sys_path"]
    assert request.get("file") == data.get("init_main_from_path")
    assert request.get("name") == data.get("init_main_from_name")


# A script that opens its queue outside the ``if __name__ == "__main__":``
# guard: the forkserver's import of it must not start a queue there (nor hang
# the program's), and its workers end quietly as they start: the job fails
# with one clear error, and nothing else is printed (multiprocessing's
# bootstrapping RuntimeError was printed by every worker that started).
UNGUARDED = textwrap.dedent(
    """
    import sys

    from procq import Executor, Job, JobFailed, ProcQueue

    if sys.argv[1] == "executor":
        with Executor(max_workers=1) as ex:
            try:
                ex.submit(abs, -2).result(timeout=30)
            except Exception as e:
                print("FAILED", e.failure.kind)
                print(e.failure.message)
    else:
        q = ProcQueue(lanes=1, start_method=sys.argv[1])
        try:
            q.push_and_wait(Job("a", abs, args=(-2,)), timeout=30)
        except JobFailed as e:
            print("FAILED", e.failure.kind)
            print(e.failure.message)
        q.close()
    """
)


@pytest.mark.parametrize("how", ["forkserver", "spawn", "executor"])
def test_a_script_that_opens_a_queue_unguarded_fails_with_one_clear_error(tmp_path: Path, how: str) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    proc = _run([sys.executable, str(script), how], tmp_path)
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout.splitlines()
    assert said[0] == "FAILED crashed", proc.stdout
    assert "opens a procq queue when it is imported" in said[1]
    assert "if __name__ == '__main__':" in said[1]
    assert proc.stderr == "", proc.stderr


BY_REFERENCE = textwrap.dedent(
    """
    import probe

    from procq import Job, ProcQueue

    if __name__ == "__main__":
        with ProcQueue(lanes=1) as q:
            # probe.loaded travels by reference: unpickling it needs no cloudpickle.
            print("LOADED", q.push_and_wait(Job("loaded", probe.loaded, args=("cloudpickle",))))
    """
)


def test_workers_start_with_what_unpickles_a_function_sent_by_value(tmp_path: Path) -> None:
    """Functions of the main module travel by value (cloudpickle), as lambdas
    and closures do: a new worker has cloudpickle loaded before its first job,
    rather than importing it at each start."""
    script = tmp_path / "by_reference.py"
    script.write_text(BY_REFERENCE)
    (tmp_path / "probe.py").write_text("import sys\n\n\ndef loaded(name):\n    return name in sys.modules\n")
    proc = _run([sys.executable, str(script)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["LOADED True"]


# The forkserver started by someone else before the first queue: procq cannot
# add to it, its workers import the main module as before, and a DEBUG line says so.
STARTED_BEFORE = textwrap.dedent(
    """
    import logging
    import multiprocessing
    import os

    with open(os.environ["COUNT_FILE"], "a") as f:
        f.write(f"{__name__}\\n")

    from procq import Job, ProcQueue


    def triple(x):
        return 3 * x


    if __name__ == "__main__":
        logging.basicConfig(level=logging.DEBUG, format="%(name)s %(levelname)s %(message)s")
        multiprocessing.get_context("forkserver").Process(target=abs, args=(1,)).start()
        with ProcQueue(lanes=1) as q:
            print("RESULT", q.push_and_wait(Job("triple", triple, args=(14,)), timeout=30))
    """
)


def test_a_forkserver_started_before_the_first_queue_is_used_as_it_is(tmp_path: Path) -> None:
    script = tmp_path / "started_before.py"
    script.write_text(STARTED_BEFORE)
    proc = _run([sys.executable, str(script)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["RESULT 42"]
    assert "procq.worker DEBUG the forkserver does not import the main module: the forkserver was started" in (
        proc.stderr
    )
    # The program's child and procq's worker; and the lane's template, if it
    # started before the queue closed: that server lacks cloudpickle, which the
    # worker imported for the job, so the lane learned it (``_worker.warm``).
    assert _imports(tmp_path).count("__mp_main__") in (2, 3)


# A script whose top level waits for a thread that imports a module: the
# forkserver runs it without holding the import system's global lock.
THREADED = textwrap.dedent(
    """
    import threading


    def load():
        import colorsys  # noqa: F401


    loader = threading.Thread(target=load)
    loader.start()
    loader.join()

    from procq import Job, ProcQueue

    if __name__ == "__main__":
        with ProcQueue(lanes=1) as q:
            print("RESULT", q.push_and_wait(Job("a", abs, args=(-3,)), timeout=30))
    """
)


def test_a_script_that_waits_for_an_import_in_a_thread_does_not_hang_the_forkserver(tmp_path: Path) -> None:
    script = tmp_path / "threaded.py"
    script.write_text(THREADED)
    proc = _run([sys.executable, str(script)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["RESULT 3"]
