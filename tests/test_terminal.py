"""An untrusted job, sandboxed or not, never touches the supervisor's
terminal: the supervisor runs under a real pseudo-terminal
(``terminal_program``), as root and as ``nobody``; its jobs hold no
descriptor of it, so they cannot read what is typed, change its modes or
size, or ``ioctl`` it at all; what they print still appears on it; and a job
that prints a GiB costs the supervisor little memory while a canary lane
answers on."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import termios
import threading
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sandboxes are Linux's")

HERE = Path(__file__).parent
TYPED = "typed-by-the-user-4711"


class Screen:
    """What the program writes to its terminal, read as it comes (the
    flood's byte 1 counted, not kept); types a line when asked."""

    def __init__(self, master: int) -> None:
        self.master = master
        self.text = bytearray()
        self.floods = 0
        self.typed = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 1 << 16)
            except OSError:  # EIO: every holder of the terminal has closed it
                return
            if not chunk:
                return
            kept = chunk.replace(b"\x01", b"")
            self.floods += len(chunk) - len(kept)
            self.text += kept
            if not self.typed.is_set() and b"TYPE A LINE" in self.text:
                os.write(self.master, TYPED.encode() + b"\n")
                self.typed.set()


def _run(mode: str) -> tuple[dict[str, Any], Screen]:
    master, slave = pty.openpty()
    termios.tcsetwinsize(slave, (24, 80)) if hasattr(termios, "tcsetwinsize") else None
    argv = [sys.executable, "-I", str(HERE / "terminal_program.py"), mode, str(HERE), str(HERE.parent)]
    try:
        program = subprocess.Popen(
            argv, cwd="/", stdin=slave, stdout=slave, stderr=slave, start_new_session=True, close_fds=True
        )
    finally:
        os.close(slave)
    screen = Screen(master)
    try:
        program.wait(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(program.pid, signal.SIGKILL)
        program.wait(timeout=10)
        pytest.fail(f"the program did not finish within 240 s: {bytes(screen.text[-3000:])!r}")
    finally:
        screen.thread.join(timeout=30)
        os.close(master)
    text = bytes(screen.text).decode(errors="replace")
    assert program.returncode == 0, text[-3000:]
    line = next(line for line in reversed(text.splitlines()) if line.startswith("RESULT "))
    said: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return said, screen


def _held_nothing(said: dict[str, Any], lane: str) -> None:
    for fd in ("0", "1", "2"):
        tried = said[fd]
        assert tried["tty"] is False, (lane, fd, tried)
        assert TYPED not in str(tried.get("read", "")), (lane, fd, tried)
        assert tried["echo off"] == "ENOTTY" and tried["window size"] == "ENOTTY", (lane, fd, tried)
    assert said["/dev/tty"] in ("ENXIO", "EACCES", "ENOENT"), (lane, said)
    assert not [link for link in said["fds"] if link.startswith(("/dev/pts", "/dev/tty", "/dev/ptmx"))], said


@pytest.mark.parametrize("mode", ["root", "nobody"])
def test_a_job_never_touches_the_supervisors_terminal(mode: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("the program becomes nobody (or stays root) from root")
    said, screen = _run(mode)
    assert said["uid"] == (0 if mode == "root" else 65534)
    assert said["line typed"] is True
    for lane in ("untrusted", "sandboxed"):
        _held_nothing(said[lane], lane)
    # What was typed reached the supervisor alone; its terminal is as it was.
    assert said["line read"].strip() == TYPED
    assert said["terminal after"] == said["terminal before"]
    assert said["terminal before"]["echo"] is True
    text = bytes(screen.text).decode(errors="replace")
    for lane in ("untrusted", "sandboxed"):
        assert f"hello from a job of lane {lane}" in text
    # A GiB printed: all of it reached the terminal, little of it the supervisor's memory,
    # and the canary lane answered throughout.
    assert said["flood"] == 1024
    assert screen.floods == 1024 << 20
    assert said["peak growth KiB"] < 32 << 10, said
    assert said["canaries"] >= 3, said
