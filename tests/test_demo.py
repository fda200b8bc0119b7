"""``python -m procq demo``, run the way CI runs it: in a process of its own."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import procq

# The directory holding the procq these tests import, so the demo runs that same code.
ROOT = Path(procq.__file__).resolve().parent.parent


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "procq", "demo", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
    )


def test_demo_runs_clean_and_shows_every_outcome() -> None:
    proc = demo()
    out = proc.stdout
    assert proc.returncode == 0, f"demo exited {proc.returncode}\n{out}\n{proc.stderr}"
    assert "demo OK" in out
    for word in ("Queued", "InFlight", "Cached", "crashed", "SIGSEGV", "SIGKILL"):
        assert word in out, word
    # Each deliberate failure is reported against its own key, with its kind and signal.
    assert re.search(r"^crash:segv +Queued InFlight +Failed .*\n +`- crashed: .*SIGSEGV", out, re.M)
    assert re.search(r"^crash:sigkill +Queued +Failed .*\n +`- crashed: .*SIGKILL", out, re.M)
    assert re.search(r"^pow:unbounded +Queued +Failed .*\n +`- timeout: ", out, re.M)
    # The killed and the broken key were retried: a fresh run (Queued) that completed.
    assert re.search(
        r"^ast:hung +Queued InFlight Queued +Completed .*\n +`- 1st run, pid \d+: crashed: .*SIGKILL", out, re.M
    )
    assert re.search(r"^ast:broken +Queued Queued +Completed .*\n +`- 1st run, pid \d+: error: SyntaxError", out, re.M)
    assert re.search(r"^ +cpu +2 +2 +0 +0 +2 +3 ", out, re.M), "cpu lane: 2 crashes, 3 restarts"
    assert re.search(r"^ +tools +2 +2 +0 +0 +1 +1 ", out, re.M), "tools lane: 1 crash, 1 restart"


def test_demo_exits_non_zero_with_the_reason_when_jobs_overrun() -> None:
    # pow:unbounded alone runs 0.5s before its timeout kills it, so a 0.05s wait cannot see every
    # job end. Which wait gives up first (for the gates to start, for the hung job's pid, or for
    # the jobs) is a race.
    proc = demo("--jobs", "4", "--timeout", "0.05")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    reason = (
        r"the 4 gate jobs did not all start within 0.05s"
        r"|'ast:hung' never reported its worker's pid|\d+ jobs had not ended after 0.05s: .*"
    )
    assert re.fullmatch(rf"demo FAILED: ({reason})\n", proc.stderr), proc.stderr


def test_demo_help_explains_the_options() -> None:
    proc = demo("--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage: python -m procq demo" in proc.stdout
    for option in ("--jobs N", "--size X", "--start-method", "--timeout SECONDS", "Exit status"):
        assert option in proc.stdout, option


def test_demo_rejects_too_few_jobs() -> None:
    proc = demo("--jobs", "1")
    assert proc.returncode == 2
    assert "argument --jobs: must be at least 4, got 1" in proc.stderr
