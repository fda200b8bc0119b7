"""``procq top``: a live view of the monitored queues of this user, in other processes.

It finds the queues' sockets (``_api.monitor.find``: every queue opened with
``monitor=True`` by this user, or those of one process, ``--pid``; or one
queue, ``--name``), asks each for a snapshot every ``--interval`` seconds,
and draws them with rich (``procq[top]``): per queue its lanes (workers,
depths, rates, counts), its workers (pid, memory, CPU, the job each runs
and for how long) and its last failures. Rates and CPU shares are the
change between two snapshots. ``--once`` draws one screen and exits;
``--once --json`` prints each queue's snapshot as one line of JSON (its
``stats`` are ``q.stats().to_dict()``), for scripts. Quit with q or Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import sys
import time
from collections.abc import Iterator
from typing import Any

from procq._api.monitor import fetch, find, runtime_dir, search_dirs

__all__ = ["main"]

Snapshot = dict[str, Any]


#: The width ``--once`` draws at into a pipe: enough for any table, which takes its own width.
_UNBOUNDED = 1000


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Watch this user's monitored queues (ProcQueue(..., monitor=True)) live.",
        epilog=f"Queues announce themselves in {runtime_dir()} ($XDG_RUNTIME_DIR/procq, or <tempdir>/procq-<uid>).",
    )
    p.add_argument("--pid", type=int, help="only the queues of this process")
    p.add_argument("--name", help="only the queue of this name (ProcQueue(name=...))")
    p.add_argument("--once", action="store_true", help="draw one screen and exit")
    p.add_argument("--json", action="store_true", help="with --once: print each queue's snapshot as a JSON line")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    return p


def collect(pid: int | None, name: str | None) -> list[Snapshot]:
    """One snapshot of every matching queue that answers."""
    found = []
    for path in find(pid):
        with contextlib.suppress(OSError, ValueError):
            snap = fetch(path, timeout=2.0)  # (a stopped process must not freeze the screen for long)
            if name is None or snap.get("name") == name:
                found.append(snap)
    return found


def main(argv: list[str], prog: str = "procq top") -> int:
    args = _parser(prog).parse_args(argv)
    if args.json and not args.once:
        print(f"{prog}: --json prints one snapshot: use it with --once", file=sys.stderr)
        return 2
    if args.interval <= 0:
        print(f"{prog}: --interval must be above 0, got {args.interval}", file=sys.stderr)
        return 2
    snaps = collect(args.pid, args.name)
    if args.once and not snaps:
        which = "" if args.pid is None else f" of process {args.pid}"
        which += "" if args.name is None else f" named {args.name!r}"
        print(
            f"{prog}: no monitored queue{which} found in {' or '.join(search_dirs())} (a queue is visible "
            "only if opened with ProcQueue(..., monitor=True), by this user)",
            file=sys.stderr,
        )
        return 1
    if args.json:
        for snap in snaps:
            print(json.dumps(snap), flush=True)
        return 0
    try:
        from rich.console import Console
    except ImportError:
        print(f"{prog}: the screen needs rich: pip install 'procq[top]' (or use --once --json)", file=sys.stderr)
        return 2
    if args.once:
        # Into a pipe or a file, no width is known (rich would take 80 and cut
        # the columns): the screen is drawn as wide as it is, unless COLUMNS says.
        fit = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
        console = Console(width=_UNBOUNDED, soft_wrap=True) if fit else Console()
        console.print(View(expand=not fit).render(snaps))
        return 0
    view = View()
    return _live(view, args)


def _live(view: View, args: argparse.Namespace) -> int:
    from rich.live import Live

    with _keys() as pressed, Live(view.render(collect(args.pid, args.name)), screen=True, auto_refresh=False) as live:
        try:
            while not pressed(args.interval):
                live.update(view.render(collect(args.pid, args.name)), refresh=True)
        except KeyboardInterrupt:
            pass
    return 0


@contextlib.contextmanager
def _keys() -> Iterator[Any]:
    """A wait of up to N seconds that returns True once q is pressed (stdin in cbreak mode, if a terminal)."""
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    saved = None
    if fd is not None:
        import termios
        import tty

        saved = termios.tcgetattr(fd)
        tty.setcbreak(fd)

    def pressed(timeout: float) -> bool:
        if fd is None:
            time.sleep(timeout)
            return False
        ready, _, _ = select.select([fd], [], [], timeout)
        return bool(ready) and os.read(fd, 1) in (b"q", b"Q")

    try:
        yield pressed
    finally:
        if fd is not None and saved is not None:
            import termios

            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


class View:
    """Draws snapshots, remembering the last one of each queue for rates and CPU shares."""

    def __init__(self, expand: bool = True) -> None:
        self._last: dict[tuple[int, str], Snapshot] = {}
        self._expand = expand  # the last failures' table fills the screen's width

    def render(self, snaps: list[Snapshot]) -> Any:
        from rich.console import Group
        from rich.text import Text

        if not snaps:
            return Text(f"no monitored queue in {runtime_dir()} (ProcQueue(..., monitor=True)); q quits", style="dim")
        parts: list[Any] = []
        seen: dict[tuple[int, str], Snapshot] = {}
        for snap in snaps:
            ident = (snap["pid"], snap["name"])
            parts.extend(self._queue(snap, self._last.get(ident)))
            seen[ident] = snap
        self._last = seen  # (a queue that closed is forgotten)
        return Group(*parts)

    def _queue(self, snap: Snapshot, last: Snapshot | None) -> list[Any]:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        stats = snap["stats"]
        span = None if last is None else max(1e-9, snap["time"] - last["time"])
        title = Text.assemble(
            (f"{snap['name']}", "bold cyan"),
            f"  pid {snap['pid']}  keys: {stats['pending']} pending, {stats['processing']} running, "
            f"{stats['completed']} completed, {stats['failed']} failed  ",
            (snap.get("command", ""), "dim"),
        )
        lanes = Table(title="lanes", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        for col in ("lane", "workers", "waiting", "sched", "running", "done/s", "fail/s", "done", "failed", "cached",
                    "joined", "avg run", "refused"):  # fmt: skip
            lanes.add_column(col, justify="left" if col == "lane" else "right")
        for name, lane in snap["lanes"].items():
            failed = sum(lane["failed"].values())
            before = None if last is None else last["lanes"].get(name)
            done_rate = fail_rate = "-"
            if before is not None and span is not None:
                done_rate = f"{(lane['completed'] - before['completed']) / span:.1f}"
                fail_rate = f"{(failed - sum(before['failed'].values())) / span:.1f}"
            run = lane["run_seconds"]
            runs = sum(run["counts"])
            lanes.add_row(
                name, f"{lane['workers_alive']}/{lane['workers']}", str(lane["waiting"]), str(lane["scheduled"]),
                str(lane["running"]), done_rate, fail_rate, str(lane["completed"]), str(failed), str(lane["cached"]),
                str(lane["joined"]), _seconds(run["sum"] / runs) if runs else "-",
                str(sum(lane.get("sandbox_refused", {}).values())),
            )  # fmt: skip
        workers = Table(
            title="workers", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True
        )
        for col in ("pid", "lane", "memory", "cpu", "jobs", "job", "running for"):
            workers.add_column(col, justify="left" if col in ("lane", "job") else "right")
        cpu_before = {} if last is None else {w["pid"]: w["cpu_seconds"] for w in last["workers"]}
        for w in snap["workers"]:
            cpu = "-"
            if span is not None and w["pid"] is not None and w["pid"] in cpu_before:
                cpu = f"{100 * max(0.0, w['cpu_seconds'] - cpu_before[w['pid']]) / span:.0f}%"
            running = w["running_seconds"]
            workers.add_row(
                str(w["pid"] or "-"), w["lane"], _size(w["memory_bytes"]), cpu, str(w["jobs"]), w["key"] or "",
                "" if running is None else _seconds(running),
            )  # fmt: skip
        parts: list[Any] = [title, lanes, workers]
        if snap["failures"]:
            failures = Table(
                title="last failures", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, expand=self._expand
            )
            for col in ("at", "lane", "key", "kind"):
                failures.add_column(col, no_wrap=True, max_width=32)
            failures.add_column("message", no_wrap=True, overflow="ellipsis", ratio=1)
            for f in snap["failures"][-8:]:
                at = time.strftime("%H:%M:%S", time.localtime(f["time"]))
                failures.add_row(at, f["lane"], f["key"] or "-", f["kind"], f["message"])
            parts.append(failures)
        return parts


def _seconds(s: float) -> str:
    if s < 0.01:
        return f"{s * 1000:.1f}ms"
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s < 120:
        return f"{s:.1f}s"
    return f"{int(s // 60)}m{int(s % 60):02d}s"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)  # pragma: no cover
