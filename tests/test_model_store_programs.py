"""Several queues, each in a process of its own, on one store, checked against
a model with hypothesis.

Rules have a program push a key (one ``push``, or ``push_all`` with the job
repeated, then pushes it again until its first handle is done: re-pushes
racing the job's end), cancel a key, or die by SIGKILL (a new program takes
its place). Commands run at once in the programs, each in a thread, so
programs race each other on the same keys too. Whatever the interleaving:

- a key runs once, unless a run of it was cancelled or its holder died
  before its row was committed (each allows one more run);
- every handle and ``Cached`` of a key that completed has the one output, a
  run id the job wrote to the side effect file; no other failure than
  ``cancelled`` or ``interrupted`` is ever seen, and no push raises.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

PROGRAMS = 3
KEYS = ("a", "b", "c", "d-slow", "e-slow", "f-slow")  # (a key ending in "slow" works 0.1 s: see store_program._job)
#: Bound on a program's answer (each of its handles waits at most 60 s).
ANSWER = 90.0
PROGRAM = os.path.join(os.path.dirname(__file__), "store_program.py")


class Program:
    """One program serving commands (``store_program.serve``), its answers read by a thread."""

    def __init__(self, url: str, log: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, PROGRAM, "serve", url, log], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.answers: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        said = self.answers.get(timeout=ANSWER)
        assert said == "ready\n", f"a program did not start (it said {said!r}; its stderr says why)"
        self.waiting: set[int] = set()  # commands sent, not answered

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.answers.put(line)
        self.answers.put("")  # (the program ended)

    def send(self, command: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        self.waiting.add(command["id"])

    def collect(self) -> list[dict[str, Any]]:
        """Every answer still due."""
        got = []
        while self.waiting:
            line = self.answers.get(timeout=ANSWER)
            assert line, f"a program ended with commands unanswered (exit code {self.proc.wait(timeout=30)})"
            answer = json.loads(line)
            self.waiting.discard(answer["id"])
            got.append(answer)
        return got

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)  # (our own child, by pid)
        self._end()

    def close(self) -> None:
        """No more commands: the program answers those it has, and ends."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=ANSWER)
        finally:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGKILL)
            self._end()

    def _end(self) -> None:
        self.proc.wait(timeout=30)
        self.reader.join(timeout=30)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


class ProgramsMachine(RuleBasedStateMachine):
    """The model: per key, the runs allowed (one, and one more per cancel
    that hit it or holder that died) and the outputs seen."""

    url: ClassVar[str] = ""
    log: ClassVar[str] = ""
    programs: ClassVar[list[Program]] = []

    def __init__(self) -> None:
        super().__init__()
        self.prefix = uuid.uuid4().hex[:8] + ":"  # the keys of this example only
        self.ids = iter(range(1, 1 << 30))
        self.sent: dict[int, tuple[str, str]] = {}  # command id -> (op, key)
        self.pushed_to: list[set[str]] = [set() for _ in self.programs]  # keys each program pushed
        self.extra: collections.Counter[str] = collections.Counter()  # runs allowed beyond the first
        self.outputs: dict[str, set[str]] = collections.defaultdict(set)
        self.kills = 0

    def _send(self, p: int, op: str, key: str, repeats: int = 1, after: float = 0.0) -> None:
        n = next(self.ids)
        self.sent[n] = (op, self.prefix + key)
        self.programs[p].send({"id": n, "op": op, "key": self.prefix + key, "repeats": repeats, "after": after})

    @rule(p=st.integers(0, PROGRAMS - 1), key=st.sampled_from(KEYS), repeats=st.sampled_from([1, 1, 2, 4]))
    def push(self, p: int, key: str, repeats: int) -> None:
        self.pushed_to[p].add(self.prefix + key)
        self._send(p, "push", key, repeats)

    @rule(p=st.integers(0, PROGRAMS - 1), key=st.sampled_from(KEYS))
    def cancel(self, p: int, key: str) -> None:
        self._send(p, "cancel", key)

    @rule(
        p=st.integers(0, PROGRAMS - 1),
        other=st.integers(0, PROGRAMS - 1),
        key=st.sampled_from(KEYS),
        after=st.sampled_from([0.0, 0.005, 0.02, 0.08]),
    )
    def push_and_cancel(self, p: int, other: int, key: str, after: float) -> None:
        """A push, and a cancel of its key (from the same program or another)
        ``after`` seconds later: before its job starts, while it runs, as it ends."""
        self.push(p, key, 1)
        self._send(other, "cancel", key, after=after)

    @precondition(lambda self: self.kills < 1)
    @rule(p=st.integers(0, PROGRAMS - 1), key=st.sampled_from(KEYS))
    def kill(self, p: int, key: str) -> None:
        """A push, and at once a SIGKILL of the program (its unanswered commands
        are lost with it; its job may be running); a new one takes its place."""
        self.push(p, key, 1)
        self.kills += 1
        program = self.programs[p]
        program.kill()
        for key in self.pushed_to[p]:
            self.extra[key] += 1  # its run may have ended unwritten
        self.pushed_to[p] = set()
        for n in program.waiting:
            self.sent.pop(n)
        self.programs[p] = Program(self.url, self.log)

    @rule()
    def check(self) -> None:
        """Wait for every answer, and check the model."""
        for program in self.programs:
            for answer in program.collect():
                op, key = self.sent.pop(answer["id"])
                assert "error" not in answer, f"{op} {key!r} raised: {answer['error']}"
                if op == "cancel":
                    self.extra[key] += answer["cancelled"]
                    event(f"cancel: {answer['cancelled']}")
                    continue
                for how, value in answer["outs"]:
                    event(how)
                    if how.endswith(" failed"):
                        assert value in ("cancelled", "interrupted"), (key, how, value)
                    else:
                        self.outputs[key].add(value)
        runs = self._runs()
        for key in {self.prefix + k for k in KEYS}:
            outputs = self.outputs.get(key, set())
            assert len(outputs) <= 1, f"{key!r} gave several outputs: {outputs}"
            assert outputs <= set(runs[key]), f"{key!r} gave an output no run of it made: {outputs}"
            assert len(runs[key]) <= 1 + self.extra[key], (
                f"{key!r} ran {len(runs[key])} times; allowed: 1 + {self.extra[key]} (cancels and deaths)"
            )

    def _runs(self) -> dict[str, list[str]]:
        runs: dict[str, list[str]] = collections.defaultdict(list)
        if os.path.exists(self.log):
            with open(self.log) as f:
                for line in f:
                    key, run = line.split()
                    if key.startswith(self.prefix):
                        runs[key].append(run)
        return runs

    def teardown(self) -> None:
        self.check()


def test_programs_on_one_store_run_each_key_once(url: str, tmp_path: Path) -> None:
    log = str(tmp_path / "runs")
    programs: list[Program] = []
    try:
        for _ in range(PROGRAMS):
            programs.append(Program(url, log))
        ProgramsMachine.url, ProgramsMachine.log, ProgramsMachine.programs = url, log, programs
        run_state_machine_as_test(
            ProgramsMachine,
            settings=settings(
                max_examples=int(os.environ.get("PROCQ_MODEL_EXAMPLES", "6")),
                stateful_step_count=15,
                deadline=None,
                database=None,
            ),
        )
    finally:
        for program in ProgramsMachine.programs or programs:
            program.close()
        ProgramsMachine.programs = []


pytestmark = pytest.mark.timeout(600)
