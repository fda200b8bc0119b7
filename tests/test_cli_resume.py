"""``procq run`` end to end, as a process of its own: killed with SIGKILL (or
interrupted with Ctrl-C) mid-run, then run again with the same ``--store``.
The final output holds every item exactly once, no item that completed ran
twice, and the killed run leaves no process behind."""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from core_support import assert_all_gone
from process_support import linux_only, subreaper

import procq

ROOT = Path(procq.__file__).resolve().parent.parent
N = 12
GATED = 5  # the item that blocks the first run: the items before it complete, those after it wait

# The stage: every item logs "<n> <pid>" when it completes; the gated item
# first blocks opening a FIFO nobody writes to, unless the release file exists.
STAGE = textwrap.dedent(
    """
    import os

    def work(item):
        if item.get("gate") and not os.path.exists(item["gate"] + ".released"):
            with open(item["gate"], "rb") as fifo:  # blocks: no writer, ever
                fifo.read()
        fd = os.open(item["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{item['n']} {os.getpid()}\\n".encode())
        os.close(fd)
        return item["n"] * 10
    """
)


def _command(tmp_path: Path, output: str) -> list[str]:
    return [
        sys.executable, "-m", "procq", "run", "stage_e2e:work", "--input", str(tmp_path / "in.jsonl"),
        "--output", output, "--store", str(tmp_path / "run.db"), "--workers", "1",
    ]  # fmt: skip


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _read_lines(proc: subprocess.Popen[bytes], count: int, timeout: float) -> list[dict[str, object]]:
    """``count`` JSON lines from the process's stdout, each waited for (bounded)."""
    assert proc.stdout is not None
    lines: list[dict[str, object]] = []
    buffer = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while len(lines) < count:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise AssertionError(f"only {len(lines)} of {count} lines within {timeout}s: {lines}")
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                raise AssertionError(f"the run ended after {len(lines)} lines: {proc.wait(10)}")
            buffer += chunk
            *whole, buffer = buffer.split(b"\n")
            lines += [json.loads(line) for line in whole]
    return lines


@pytest.mark.skipif(not linux_only, reason="the subreaper that adopts the killed run's workers is Linux's")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["sigkill", "ctrl-c"])
def test_killed_mid_run_then_resumed(tmp_path: Path, how: str) -> None:
    (tmp_path / "stage_e2e.py").write_text(STAGE)
    gate, log = tmp_path / "gate", tmp_path / "log"
    os.mkfifo(gate)
    items = [{"n": n, "log": str(log), "gate": str(gate) if n == GATED else None} for n in range(N)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))

    with subreaper():
        first = subprocess.Popen(
            _command(tmp_path, "-"), cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        try:
            written = _read_lines(first, GATED, timeout=60)  # the items before the gated one
            workers = [p.pid for p in psutil.Process(first.pid).children(recursive=True)]
            assert workers
            if how == "sigkill":
                os.killpg(first.pid, signal.SIGKILL)
                assert first.wait(timeout=20) == -signal.SIGKILL
            else:
                first.send_signal(signal.SIGINT)
                assert first.wait(timeout=20) == 130
                assert first.stderr is not None
                summary = first.stderr.read().decode()
                assert "interrupted: running items were killed" in summary, summary
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
                first.wait(timeout=20)
            for stream in (first.stdout, first.stderr):
                assert stream is not None
                stream.close()
        assert_all_gone(workers)  # the killed run's workers exit on their own

    assert sorted(line["index"] for line in written) == list(range(GATED))
    ran_first = [line.split()[0] for line in log.read_text().splitlines()]
    assert ran_first == [str(n) for n in range(GATED)]

    (tmp_path / "gate.released").touch()
    output = tmp_path / "out.jsonl"
    second = subprocess.run(
        _command(tmp_path, str(output)), cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60
    )
    assert second.returncode == 0, second.stderr
    final = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(line["index"] for line in final) == list(range(N))  # every item, exactly once
    assert {line["index"]: line["output"] for line in final} == {n: n * 10 for n in range(N)}
    assert all(line["state"] == "done" for line in final)
    assert sorted(line["index"] for line in final if not line["cached"]) == list(range(GATED, N))
    ran = sorted(int(line.split()[0]) for line in log.read_text().splitlines())
    assert ran == list(range(N))  # no completed item ran twice; the rest ran once, now
    assert re.search(rf"^  done +{N - GATED} .*\n  cached +{GATED} .*\n  failed +0$", second.stderr, re.M), (
        second.stderr
    )
