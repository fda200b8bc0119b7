"""What ``procq run`` tells the person at the terminal, on stderr: a progress
bar while it runs (only when stderr is a terminal, redrawn at most
``REFRESH`` times a second, so a log file or CI output gets no control
characters), with the items' rate and, when their number is known (an input
file), the time left at that rate; and a summary table at the end: items
done, answered from the store (cached), failed by kind, the time taken, and
the failed items by index and key (the first ``NAMED``).

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
#: Failed items the summary names one by one (the rest are counted).
NAMED = 10


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
        self.named: list[str] = []  # the first NAMED failed items, as the summary says them
        self.began = time.monotonic()
        self._drawn = 0.0

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    def start(self) -> None:
        self.began = time.monotonic()
        self.draw()

    def ended(self, kind: str | None, cached: bool, index: int = 0, key: str = "", why: str = "") -> None:
        """An item's line was written: ``kind`` is its failure's, None if done
        (``index``, ``key``, ``why``: which item failed, and its message)."""
        if kind is not None:
            self.failures[kind] += 1
            if len(self.named) < NAMED:
                first = why.strip().splitlines()[0] if why.strip() else ""
                said = f"{kind}: {first}" if first else kind
                self.named.append(f"#{index} {key!r}: {_printable(said[:160])}")
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
        elapsed = now - self.began
        rate = ended / elapsed if elapsed > 0 else 0.0
        if self.total:
            filled = min(BAR, BAR * ended // self.total)
            head = f"[{'#' * filled}{'.' * (BAR - filled)}] {ended}/{self.total}"
        else:
            head = f"{ended} items"
        text = f"{head}  done {self.done}  cached {self.cached}  failed {self.failed}  {elapsed:.1f}s  {rate:.1f}/s"
        if self.total and rate > 0 and ended < self.total:
            text += f"  ETA {_duration((self.total - ended) / rate)}"
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
        if self.named:
            more = self.failed - len(self.named)
            which = f" (the first {len(self.named)}; {more} more in the output)" if more else ""
            lines.append(f"  failed items{which}:")
            lines += [f"    {item}" for item in self.named]
        self.stream.write("\n".join(lines) + "\n")
        self.stream.flush()


def _printable(text: str) -> str:
    """``text`` with its control characters written as escapes: a job's message
    is the job's to write, and a terminal obeys the escapes it is sent (to
    clear the screen, set the title, move the cursor)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _duration(seconds: float) -> str:
    """``seconds`` as the progress line says a time left: 42s, 3m07s, 2h05m."""
    seconds = int(seconds + 0.5)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
