"""What ``procq run`` tells the person at the terminal, on stderr: a progress
bar while it runs (only when stderr is a terminal, redrawn at most
``REFRESH`` times a second, so a log file or CI output gets no control
characters), and a summary table at the end: items done, answered from the
store (cached), failed by kind, and the time taken.

stdout is left to the JSON lines, so ``procq run ... | next-stage`` works.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import IO, Any

from procq._model.values import Failure

__all__ = ["Tally", "failure_fields"]

#: Seconds between two redraws of the progress bar.
REFRESH = 0.1
BAR = 24


def failure_fields(failure: Failure) -> dict[str, Any]:
    """A failure as the JSON object of its output line."""
    return {
        "kind": failure.kind,
        "message": failure.message,
        "exc_type": failure.exc_type,
        "exitcode": failure.exitcode,
        "signal": failure.signal,
        "traceback": failure.traceback,
    }


class Tally:
    """Counts of ended items; draws the bar and the summary."""

    def __init__(self, stream: IO[str], total: int | None, quiet: bool) -> None:
        self.stream = stream
        self.total = total  # items in the input, when it is a file (None: a pipe)
        self.quiet = quiet
        self.bar = not quiet and _isatty(stream)
        self.refresh = REFRESH
        self.done = 0
        self.cached = 0
        self.failures: Counter[str] = Counter()
        self.began = time.monotonic()
        self._drawn = 0.0

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    def start(self) -> None:
        self.began = time.monotonic()
        self.draw()

    def ended(self, kind: str | None, cached: bool) -> None:
        """An item's line was written: ``kind`` is its failure's, None if done."""
        if kind is not None:
            self.failures[kind] += 1
        elif cached:
            self.cached += 1
        else:
            self.done += 1
        if self.bar and time.monotonic() - self._drawn >= REFRESH:
            self.draw()

    def draw(self) -> None:
        if not self.bar:
            return
        self._drawn = now = time.monotonic()
        ended = self.done + self.cached + self.failed
        if self.total:
            filled = min(BAR, BAR * ended // self.total)
            head = f"[{'#' * filled}{'.' * (BAR - filled)}] {ended}/{self.total}"
        else:
            head = f"{ended} items"
        text = f"{head}  done {self.done}  cached {self.cached}  failed {self.failed}  {now - self.began:.1f}s"
        self.stream.write(f"\r{text}\x1b[K")
        self.stream.flush()

    def finish(self, interrupted: bool) -> None:
        """Clear the bar and print the summary table."""
        if self.bar:
            self.stream.write("\r\x1b[K")
        if self.quiet:
            self.stream.flush()
            return
        ended = self.done + self.cached + self.failed
        took = time.monotonic() - self.began
        rows = [("done", self.done, "ran in this run"), ("cached", self.cached, "answered without running")]
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(self.failures.items()))
        rows.append(("failed", self.failed, kinds))
        title = f"procq run: {ended} items in {took:.1f}s"
        if interrupted:
            title += " (interrupted: running items were killed; with --store a re-run resumes)"
        lines = [title, *(f"  {name:<7}{n:>8}   {note}".rstrip() for name, n, note in rows)]
        self.stream.write("\n".join(lines) + "\n")
        self.stream.flush()


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
