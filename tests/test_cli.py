"""``procq --help`` and ``procq run``: the commands, the shipped example, the
output lines, failures by kind, and usage errors (``test_cli_resume``: a
run killed and resumed)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import procq
import procq.examples
from procq.__main__ import main

ROOT = Path(procq.__file__).resolve().parent.parent


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "procq", *args], cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=50
    )


def lines(text: str) -> list[dict[str, object]]:
    return sorted((json.loads(line) for line in text.splitlines()), key=lambda line: line["index"])  # type: ignore[arg-type,return-value]


def test_help_lists_the_commands() -> None:
    proc = cli("--help")
    assert proc.returncode == 0, proc.stderr
    assert "run " in proc.stdout and "demo " in proc.stdout
    assert cli().returncode == 2


def test_version() -> None:
    proc = cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"python -m procq {importlib.metadata.version('procq')}"


def test_each_command_names_itself_as_it_was_called() -> None:
    for command in ("demo", "run", "top"):
        proc = cli(command, "--help")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"usage: python -m procq {command} "), proc.stdout[:200]


NOISY = """
import sys

def stage(x):
    print(f"debug: processing {x}")
    print(f"note: {x}", file=sys.stderr)
    return x * 2
"""


@pytest.mark.parametrize("mode", [[], ["--untrusted"]], ids=["trusted", "untrusted"])
def test_what_a_stage_prints_never_mixes_with_the_json_lines(tmp_path: Path, mode: list[str]) -> None:
    (tmp_path / "noisy.py").write_text(NOISY)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    proc = subprocess.run(
        [sys.executable, "-m", "procq", "run", "noisy:stage", "-q", *mode], input="1\n2\n3\n", cwd=tmp_path,
        capture_output=True, text=True, timeout=50, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert sorted(line["output"] for line in lines(proc.stdout)) == [2, 4, 6]  # every line is JSON
    for x in (1, 2, 3):
        assert f"debug: processing {x}" in proc.stderr and f"note: {x}" in proc.stderr


def test_run_help_reads_well() -> None:
    proc = cli("run", "--help")
    assert proc.returncode == 0
    for option in ("--input", "--output", "--workers", "--timeout", "--memory-limit", "--retry", "--untrusted"):
        assert option in proc.stdout
    assert "--store FILE" in proc.stdout and "skips them (resume)" in proc.stdout
    assert "exit:    0 all items done, 1 some failed, 2 usage error, 130 interrupted." in proc.stdout


def test_the_shipped_example() -> None:
    proc = cli("run", "procq.examples.stage:square", "--input", procq.examples.NUMBERS, "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    out = lines(proc.stdout)
    assert [line["output"] for line in out] == [{"n": n, "square": n * n} for n in range(1, 21)]
    assert re.search(r"^procq run: 20 items in [\d.]+s\n  done +20 ", proc.stderr), proc.stderr


def test_a_crash_fails_its_item_alone_and_the_exit_status_says_so() -> None:
    proc = cli("run", "procq.examples.stage:crash_on_13", "--input", procq.examples.NUMBERS, "--workers", "2")
    assert proc.returncode == 1
    out = lines(proc.stdout)
    assert len(out) == 20
    [failed] = [line for line in out if line["state"] == "failed"]
    assert failed["index"] == 12
    assert failed["failure"]["kind"] == "crashed" and failed["failure"]["signal"] == "SIGSEGV"  # type: ignore[index]
    assert re.search(r"^  failed +1   crashed 1$", proc.stderr, re.M), proc.stderr


def test_failures_by_kind_from_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception, a line that is not JSON, a duplicate (answered from the
    first), each with its own line."""
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO('3\n"three"\n{oops\n\n3\n'))
    assert main(["run", "procq.examples.stage:square", "--workers", "1"]) == 1
    captured = capsys.readouterr()
    out = lines(captured.out)
    assert [line["index"] for line in out] == [0, 1, 2, 3]
    assert out[0]["output"] == {"n": 3, "square": 9} and out[0]["cached"] is False
    assert out[1]["failure"]["kind"] == "error"  # type: ignore[index]
    assert out[1]["failure"]["exc_type"] == "TypeError"  # type: ignore[index]
    assert out[2]["failure"]["kind"] == "input"  # type: ignore[index]
    assert out[2]["failure"]["message"].startswith("input line 3 is not JSON: ")  # type: ignore[index]
    assert out[3]["key"] == out[0]["key"] and out[3]["output"] == out[0]["output"] and out[3]["cached"] is True
    assert re.search(r"^  failed +2   error 1, input 1$", captured.err, re.M), captured.err
    # The summary names the failed items, by index and key, with what failed.
    assert re.search(rf"^    #1 {re.escape(repr(out[1]['key']))}: error: TypeError: ", captured.err, re.M), captured.err
    assert re.search(r"^    #2 '.*': input: input line 3 is not JSON: ", captured.err, re.M), captured.err


def test_the_progress_line_gives_a_rate_and_the_time_left_and_the_summary_bounds_its_list() -> None:
    """On a terminal: items a second and, when their number is known, the
    time left at that rate; the summary names the first 10 failed items and
    counts the rest."""
    import io

    from procq._cli.report import Tally

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    tally = Tally(screen, total=100, quiet=False)
    tally.began -= 10.0  # (as if started 10 s ago: 25 items in 10 s)
    for i in range(25):
        tally.ended(None if i < 13 else "error", False, i, f"k{i}", "ValueError: bad")
    tally.draw()
    line = screen.getvalue().split("\r")[-1]
    assert re.search(r"25/100 .* 2\.5/s  ETA 30s", line), line
    tally.finish(interrupted=False)
    summary = screen.getvalue()
    assert "failed items (the first 10; 2 more in the output):" in summary, summary
    assert "    #13 'k13': error: ValueError: bad" in summary and "#23 " not in summary, summary


def test_the_summary_writes_a_jobs_control_characters_as_escapes() -> None:
    # A failed job's message is the job's to write: on the terminal, the
    # summary shows its escapes rather than obeying them.
    import io

    from procq._cli.report import Tally

    screen = io.StringIO()
    tally = Tally(screen, total=1, quiet=False)
    tally.ended("error", False, 0, "k\x1b", "ValueError: \x1b[2J\x1b]0;owned\x07 gone\r")
    tally.finish(interrupted=False)
    summary = screen.getvalue()
    assert "\x1b" not in summary and "\x07" not in summary, repr(summary)
    assert "    #0 'k\\x1b': error: ValueError: \\x1b[2J\\x1b]0;owned\\x07 gone" in summary, summary


def test_text_items_timeout_and_output_that_is_not_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "stage_text.py").write_text(
        "import time\n"
        "def work(line):\n"
        "    if line == 'slow':\n"
        "        time.sleep(60)\n"
        "    return {1, 2} if line == 'set' else line.upper()\n"
    )
    (tmp_path / "in.txt").write_text("abc\nslow\nset\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    args = ["run", "stage_text:work", "--text", "-i", "in.txt", "-o", "out.jsonl", "--timeout", "0.5", "-q"]
    assert main(args) == 1
    out = lines((tmp_path / "out.jsonl").read_text())
    assert out[0]["output"] == "ABC"
    assert out[1]["failure"]["kind"] == "timeout"  # type: ignore[index]
    assert out[2]["failure"]["kind"] == "output"  # type: ignore[index]


def test_untrusted_and_retry(tmp_path: Path) -> None:
    proc = cli("run", "procq.examples.stage:square", "--untrusted", "--retry", "2", "-q", stdin="4\n5\n")
    assert proc.returncode == 0, proc.stderr
    assert [line["output"]["square"] for line in lines(proc.stdout)] == [16, 25]  # type: ignore[index]
    assert proc.stderr == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nocolon"], "the function must be given as MODULE:FUNCTION"),
        (["no_such_module_xyz:f"], "cannot import module 'no_such_module_xyz'"),
        (["procq.examples.stage:nope"], "module 'procq.examples.stage' has no 'nope'"),
        (["procq.examples.stage:square", "--workers", "0"], "argument -w/--workers: must be at least 1, got 0"),
        (["procq.examples.stage:square", "--timeout", "-1"], "must be a positive number of seconds"),
        (["procq.examples.stage:square", "--input", "/no/such/file"], "cannot open /no/such/file"),
    ],
)
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    proc = cli("run", *args)
    assert proc.returncode == 2
    assert message in proc.stderr, proc.stderr


def test_the_console_script() -> None:
    script = Path(sys.executable).with_name("procq")
    if not script.exists():
        pytest.skip("procq is not installed as a console script in this environment")
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: procq [-h] [--version] COMMAND ...")
