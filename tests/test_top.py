"""``procq top`` against a live queue in another process: the screen in a
real (pseudo-)terminal, and ``--once --json`` for scripts."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from core_support import WAIT
from observe_support import require

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The environment of the program and of ``procq top``: a runtime directory of the test's own."""
    base = tempfile.mkdtemp(prefix="procq-runtime-")
    monkeypatch.setenv("XDG_RUNTIME_DIR", base)
    path = os.pathsep.join([str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")])
    try:
        own = {"XDG_RUNTIME_DIR": base, "TMPDIR": base, "PYTHONPATH": path, "COLUMNS": "160", "LINES": "50"}
        yield {**os.environ, **own}
    finally:
        shutil.rmtree(base, ignore_errors=True)


class Program:
    """tests/observe_program.py in a process of its own, holding job "held-job-key" running."""

    def __init__(self, env: dict[str, str], directory: Path, name: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(TESTS / "observe_program.py"), name, str(directory)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        first = self.line()
        self.pid: int = first["pid"]
        self.name = name

    def line(self) -> Any:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], WAIT)
        assert ready, "the program said nothing"
        text = self.proc.stdout.readline()
        assert text, "the program ended"
        return text if text == "closed\n" else json.loads(text)

    def stats(self) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        return self.line()

    def quit(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            assert self.line() == "closed\n"
        finally:
            try:
                self.proc.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            finally:
                if self.proc.stdout is not None:
                    self.proc.stdout.close()


@pytest.fixture
def program(env: dict[str, str], tmp_path: Path) -> Iterator[Program]:
    p = Program(env, tmp_path, "watched")
    try:
        yield p
    finally:
        p.quit()


def top(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "procq", "top", *args], env=env, capture_output=True, text=True, timeout=WAIT
    )


def test_once_json_matches_the_queues_stats(program: Program, env: dict[str, str]) -> None:
    done = top(env, "--once", "--json", "--pid", str(program.pid))
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    snap = json.loads(line)
    assert snap["stats"] == program.stats()
    assert (snap["pid"], snap["name"]) == (program.pid, "watched")
    assert snap["lanes"]["cpu"]["completed"] == 3 and snap["lanes"]["cpu"]["running"] == 1
    assert [w["key"] for w in snap["workers"] if w["key"]] == ["held-job-key"]
    assert [(f["key"], f["kind"]) for f in snap["failures"]] == [("broken", "error")]
    by_name = top(env, "--once", "--json", "--name", "watched")
    assert by_name.returncode == 0 and json.loads(by_name.stdout)["pid"] == program.pid


def test_once_finds_nothing_without_a_monitored_queue(env: dict[str, str]) -> None:
    done = top(env, "--once", "--json")
    assert done.returncode == 1 and done.stdout == ""
    assert "no monitored queue found" in done.stderr and "monitor=True" in done.stderr
    assert top(env, "--json").returncode == 2  # --json needs --once


def test_the_screen_in_a_terminal_shows_lanes_and_the_running_job(program: Program, env: dict[str, str]) -> None:
    require("rich", "top")
    pexpect = require("pexpect", "test")
    child = pexpect.spawn(
        sys.executable, ["-m", "procq", "top", "--pid", str(program.pid), "--interval", "0.2"],
        env=env, dimensions=(50, 160), encoding="utf-8", timeout=WAIT,
    )  # fmt: skip
    try:
        child.expect("held-job-key")  # a worker's current job
        child.expect("lanes")
        child.expect(r"\bcpu\b")
        child.expect(r"\bio\b")
        child.expect("last failures")
        child.send("q")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


def test_once_draws_one_screen(program: Program, env: dict[str, str]) -> None:
    require("rich", "top")
    done = top(env, "--once", "--pid", str(program.pid))
    assert done.returncode == 0, done.stderr
    for text in ("watched", "lanes", "cpu", "io", "workers", "held-job-key", "broken", "error"):
        assert text in done.stdout


def test_once_into_a_pipe_draws_every_column_whole(program: Program, env: dict[str, str]) -> None:
    """With no terminal and no COLUMNS, rich would draw 80 columns and cut
    the headers ("wor…  wai…"): into a pipe the screen is as wide as it is."""
    require("rich", "top")
    piped = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
    done = top(piped, "--once", "--pid", str(program.pid))
    assert done.returncode == 0, done.stderr
    headers = ("lane", "workers", "waiting", "sched", "running", "done/s", "fail/s", "done", "failed", "cached",
               "joined", "avg run", "refused", "pid", "memory", "cpu", "jobs", "job", "running for")  # fmt: skip
    lines = done.stdout.splitlines()
    for header in headers:
        assert any(header in line.split("  ") or f" {header} " in f" {line} " for line in lines), (header, done.stdout)
    assert "…" not in done.stdout, done.stdout
    assert "held-job-key" in done.stdout
