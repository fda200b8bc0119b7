"""procq wherever Python code runs: a script file, a script in /tmp with a
sandboxed lane, ``python -c``, a script on stdin, the interactive REPL (in a
pseudo-terminal), ``python -m pkg.mod``, a package's ``__main__``, a zipapp,
and a Jupyter notebook run by a real kernel, under every Python the suite
has. Each runs one program whose main module defines a function, a lambda,
a dataclass and an exception class, and passes them to jobs as functions,
arguments and results; crashes a worker; and goes through ``map``,
``procq.Executor`` and joblib's ``Parallel`` with the procq backend."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import uuid
import zipapp
from pathlib import Path

import pexpect
import pytest
from test_main_module import PYTHONS, ROOT

# The program, as one block of top-level statements (a REPL and a notebook
# run it as they get it: no __name__ guard, which a program with no main file
# does not need). It prints one line, WHERE_RESULT and a JSON list.
PROGRAM = textwrap.dedent(
    """
    import dataclasses, json, os, sys
    import joblib
    import procq.joblib
    from procq import Executor, Job, JobFailed, Lane, ProcQueue, Sandbox

    @dataclasses.dataclass
    class Config:
        factor: int

    class MyError(Exception):
        pass

    def scaled(cfg, x):
        return Config(cfg.factor * x)

    def boom(cfg):
        raise MyError(f"bad {cfg.factor}")

    def apply(fn, x):
        return fn(x)

    def run(sandboxed):
        out = []
        lanes = {"default": Lane(workers=2)}
        if sandboxed:
            lanes["jail"] = Lane(workers=1, trusted=False, sandbox=Sandbox())
        with ProcQueue(lanes=lanes) as q:
            made = q.push_and_wait(Job("scaled", scaled, args=(Config(3), 7)), timeout=60)
            out.append(["scaled", type(made) is Config, made.factor])
            try:
                q.push_and_wait(Job("boom", boom, args=(Config(2),)), timeout=60)
            except JobFailed as e:
                out.append(["raised", isinstance(e.__cause__, MyError), str(e.__cause__)])
            out.append(["lambda arg", q.push_and_wait(Job("apply", apply, args=(lambda v: v + 1, 4)), timeout=60)])
            doubled = q.push_and_wait(Job("lam", lambda c: Config(c.factor * 2), args=(Config(5),)), timeout=60)
            out.append(["lambda fn", doubled.factor])
            try:
                q.push_and_wait(Job("crash", os._exit, args=(3,)), timeout=60)
            except JobFailed as e:
                out.append(["crash", e.failure.kind, e.failure.exitcode])
            mapped = q.map(lambda c: Config(c.factor + 1), [Config(1), Config(2)], timeout=60)
            out.append(["map", [c.factor for c in mapped]])
            if sandboxed:
                jailed = Job("jail", lambda c, x: c.factor * x, args=(Config(2), 3), lane="jail")
                out.append(["sandboxed", q.push_and_wait(jailed, timeout=60)])
        with Executor(max_workers=2) as ex:
            out.append(["executor map", [c.factor for c in ex.map(scaled, [Config(1), Config(2)], [10, 10])]])
            try:
                ex.submit(boom, Config(4)).result(60)
            except MyError as e:
                out.append(["executor raised", str(e)])
        with joblib.parallel_config(backend="procq", n_jobs=2):
            made = joblib.Parallel()(joblib.delayed(scaled)(Config(i), 2) for i in range(3))
            out.append(["joblib", [type(c) is Config and c.factor for c in made]])
            try:
                joblib.Parallel()(joblib.delayed(boom)(Config(9)) for i in range(2))
            except MyError as e:
                out.append(["joblib raised", str(e)])
        return out

    print("WHERE_RESULT", json.dumps(run(os.environ.get("WHERE_SANDBOX") == "1")))
    """
)

EXPECTED = [
    ["scaled", True, 21],
    ["raised", True, "bad 2"],
    ["lambda arg", 5],
    ["lambda fn", 10],
    ["crash", "crashed", 3],
    ["map", [2, 3]],
    ["executor map", [10, 20]],
    ["executor raised", "bad 4"],
    ["joblib", [0, 2, 4]],
    ["joblib raised", "bad 9"],
]
SANDBOXED = [*EXPECTED[:6], ["sandboxed", 6], *EXPECTED[6:]]

#: A script file runs its work under the guard, as a script must.
GUARDED = PROGRAM.replace('print("WHERE_RESULT"', 'if __name__ == "__main__":\n    print("WHERE_RESULT"')


def _env(**extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=ROOT, **extra)


def _result(stdout: str, stderr: str = "") -> list[object]:
    lines = [line for line in stdout.splitlines() if line.startswith("WHERE_RESULT ")]
    assert len(lines) == 1, f"stdout:\n{stdout}\nstderr:\n{stderr}"
    result: list[object] = json.loads(lines[0].split(" ", 1)[1])
    return result


def _run(args: list[str], cwd: Path, stdin: str | None = None, **env: str) -> list[object]:
    proc = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=150, cwd=cwd, env=_env(**env))
    assert proc.returncode == 0, proc.stderr
    return _result(proc.stdout, proc.stderr)


pytestmark = [pytest.mark.timeout(180), pytest.mark.parametrize("python", PYTHONS)]


def test_a_script_file(python: str, tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(GUARDED)
    assert _run([python, "prog.py"], tmp_path) == EXPECTED


def test_a_script_in_tmp_with_a_sandboxed_lane(python: str, tmp_path: Path) -> None:
    # Directly in /tmp, which is then on sys.path, as the sandbox's own /tmp is in every job's view.
    script = Path("/tmp") / f"procq-where-{uuid.uuid4().hex}.py"
    script.write_text(GUARDED)
    try:
        assert _run([python, str(script)], tmp_path, WHERE_SANDBOX="1") == SANDBOXED
    finally:
        script.unlink()


def test_dash_c(python: str, tmp_path: Path) -> None:
    assert _run([python, "-c", PROGRAM], tmp_path, WHERE_SANDBOX="1") == SANDBOXED


def test_a_script_on_stdin(python: str, tmp_path: Path) -> None:
    assert _run([python, "-"], tmp_path, stdin=PROGRAM, WHERE_SANDBOX="1") == SANDBOXED


def test_dash_m_a_module_and_a_package_main(python: str, tmp_path: Path) -> None:
    pkg = tmp_path / "wherepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(GUARDED)
    (pkg / "__main__.py").write_text(GUARDED)
    assert _run([python, "-m", "wherepkg.mod"], tmp_path, WHERE_SANDBOX="1") == SANDBOXED
    assert _run([python, "-m", "wherepkg"], tmp_path) == EXPECTED


def test_a_zipapp(python: str, tmp_path: Path) -> None:
    source = tmp_path / "app"
    source.mkdir()
    (source / "__main__.py").write_text(GUARDED)
    zipapp.create_archive(source, tmp_path / "app.pyz")
    assert _run([python, str(tmp_path / "app.pyz")], tmp_path, WHERE_SANDBOX="1") == SANDBOXED


def test_the_interactive_repl(python: str, tmp_path: Path) -> None:
    # Typed at the prompt of an interactive interpreter in a pseudo-terminal:
    # one line that runs the program's text in __main__, as typing it would.
    env = _env(WHERE_SANDBOX="1")
    child = pexpect.spawn(python, ["-q", "-i"], cwd=str(tmp_path), env=env, encoding="utf-8", timeout=150)
    try:
        child.expect(">>> ")
        child.sendline(f"exec(compile({PROGRAM!r}, '<stdin>', 'exec'))")
        child.expect(r"WHERE_RESULT (\[.*\])\r?\n")
        assert json.loads(child.match.group(1)) == SANDBOXED
        child.expect(">>> ")
        # The REPL's main module is nothing a worker can import: no spec, or
        # (3.13.0's new REPL) the spec of a package's __main__, which
        # multiprocessing never runs in a child.
        child.sendline("import __main__; print('NO_MAIN', getattr(__main__.__spec__, 'name', '__main__'))")
        child.expect(r"NO_MAIN (\S+)\r?\n")
        assert child.match.group(1).rpartition(".")[2] == "__main__"
        child.sendline("exit()")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)


def test_a_jupyter_notebook(python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat
    from nbclient import NotebookClient

    spec = tmp_path / "kernels" / "where"
    spec.mkdir(parents=True)
    argv = [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "where", "language": "python"}))
    definitions, last = PROGRAM.strip().rsplit("\n", 1)
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(definitions), nbformat.v4.new_code_cell(last)])
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))  # where the client finds the kernel's spec
    where = {"metadata": {"path": str(tmp_path)}}
    client = NotebookClient(notebook, kernel_name="where", timeout=150, resources=where)
    client.execute(env=_env(WHERE_SANDBOX="1"))
    printed = "".join(output.get("text", "") for cell in notebook.cells for output in cell.outputs)
    assert _result(printed) == SANDBOXED
