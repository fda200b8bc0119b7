"""``procq run MODULE:FUNCTION``: a pipeline stage from the command line.

Reads items (one JSON value per line, or with ``--text`` one string per line),
runs ``FUNCTION(item)`` for each in procq's supervised worker processes, and
writes one JSON line per input item as it ends. ``--store FILE`` makes a
re-run resume: what completed answers from the store, the rest runs.

Decisions, and why:

- **A key per item**: ``"<module>:<function>:<digest>"``, the digest a
  BLAKE2b hash of the item's canonical JSON (keys sorted, no spaces). A
  re-run matches its items by content, so it resumes even if the input was
  reordered, filtered or appended to; the line number would tie the store to
  one exact file. Equal items share a key and run once: each still gets its
  own output line (its own ``index``), the second answered from the first
  (``"cached": true``). The key names the function, not its code: change the
  code and want fresh results, use a new store file (the queue is opened with
  ``on_mismatch="ignore"``, so the key alone decides).
- **The output file is written fresh on every run**, one line per input item
  as it ends (in the order they end, each with its ``index``), flushed line by
  line. Items completed by an earlier run are written again from the store,
  so the output of the last run always has every item exactly once: no
  append-and-dedup, and no half line left by a killed run survives. A line is
  only written once its outcome is durable in the store (a queue on a store
  wakes nobody before the commit), so nothing written can be lost to a kill.
- **A killed run's claims**: its live rows stay claimed until its lease
  expires (``LEASE``); a re-run joins them, and an item whose claim ends
  ``interrupted`` that way is pushed again and runs.
- **Bounded**: at most ``WINDOW`` items are out at once, and the input is
  read as room frees, so a huge input or an endless stdin streams in bounded
  memory. Without a store, a key is forgotten once its line is written (with
  one, its row is what a re-run reads, so it stays).
- **Exit status**: 0 when every item is done, 1 when any failed, 2 for a
  usage error, 130 after Ctrl-C (running jobs killed, waiting ones
  cancelled, what completed kept in the store).

The report (progress bar, summary table) is ``_cli.report``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import queue
import sys
from collections.abc import Callable, Iterator
from typing import IO, Any

from procq._api.outcomes import Cached, InFlight
from procq._cli.report import Tally, failure_fields
from procq._model.errors import SandboxUnavailable
from procq._model.job import Job, Lane
from procq._model.policies import Retry
from procq._model.sandbox import Sandbox
from procq._model.values import Completed, Failed
from procq._stores.sqlite import SqliteStore

__all__ = ["main", "parser"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

DESCRIPTION = """\
Run a Python function over every item of a file, in parallel worker
processes, and write each item's outcome as a JSON line.

A crash (segfault, os._exit, out of memory), a timeout or an exception fails
that item alone; the other items run on. With --store, running the same
command again after a crash or Ctrl-C skips the items that completed and runs
only the rest.
"""

EPILOG = """\
input:   one JSON value per line, or with --text one string per line (blank
         lines skipped either way). FUNCTION is called with the item as its only
         argument, and must be importable by the workers: MODULE is imported
         from the current directory and sys.path.
output:  one JSON line per input item, in the order items end:
           {"index": 0, "key": "...", "state": "done", "cached": false, "output": ...}
           {"index": 1, "key": "...", "state": "failed", "failure": {"kind": "crashed", ...}}
         "index" is the item's place in the input (from 0); "key" identifies
         the item's content for --store; a failure's "kind" is one of error,
         crashed, timeout, memory, protocol, cancelled, input (a line that is
         not JSON), output (a result that is not JSON). What the function
         prints goes to stderr, never among the lines on stdout.
resume:  items are matched by content: equal items run once, and a re-run
         finds its completed items even if the input was reordered. The
         output file is written afresh by each run and ends up holding every
         item exactly once.
exit:    0 all items done, 1 some failed, 2 usage error, 130 interrupted.

sandbox: with --sandbox each item runs as in an untrusted lane, confined by
         the kernel (Landlock, namespaces, seccomp): it reads Python, the
         directories of sys.path, system libraries and the --read paths; it
         writes only a private temporary directory and the --write
         directories; no network (unless --network: all of it, or with
         --network HOST[:PORT] only those hosts, through procq's filtering
         proxy), no other process, no privilege. Where the kernel lacks a part, the run stops with the
         reason (exit 2) rather than run weaker. See docs/untrusted.md.

examples:
  # square the numbers 1 to 20 with the example stage that ships with procq
  seq 1 20 | procq run procq.examples.stage:square

  # a stage you do not trust: it reads data/, writes only out/
  procq run plugin:stage --sandbox --read data --write out -i items.jsonl

  # ... that may reach one package index and nothing else
  procq run plugin:stage --sandbox --network pypi.org --network files.pythonhosted.org -i items.jsonl

  # your own stage: def clean(item): ... in mystage.py in this directory;
  # run it again after a crash or Ctrl-C and only the unfinished items run
  procq run mystage:clean --input items.jsonl --output cleaned.jsonl --store run.db
"""

#: Items out at once (pushed, their line not yet written), at least this many.
WINDOW = 64
#: The store's lease (seconds): a re-run after a kill finds the killed run's
#: claims expired after at most this long, and runs those items then.
LEASE = 3.0


def parser(prog: str = "procq run") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "function", metavar="MODULE:FUNCTION", help="the function to call with each item, e.g. mystage:clean"
    )
    p.add_argument("-i", "--input", metavar="FILE", default="-", help="items, one per line ('-': stdin, the default)")
    p.add_argument(
        "-o", "--output", metavar="FILE", default="-", help="where to write the JSON lines ('-': stdout, the default)"
    )
    p.add_argument("--text", action="store_true", help="each input line is one string item (not parsed as JSON)")
    p.add_argument(
        "-w", "--workers", type=_positive_int, default=os.cpu_count() or 1, metavar="N",
        help="worker processes (default: the number of CPUs, %(default)s here)",
    )  # fmt: skip
    p.add_argument(
        "--timeout", type=_seconds, metavar="SECONDS", help='fail an item that runs longer than this (kind "timeout")'
    )
    p.add_argument(
        "--memory-limit",
        metavar="SIZE",
        help='fail an item whose processes use more memory, e.g. 512M or 2G (kind "memory")',
    )
    p.add_argument(
        "--retry", type=_positive_int, default=1, metavar="N",
        help="run a failed item (error, crash, timeout) up to N times in all (default 1: no retry)",
    )  # fmt: skip
    p.add_argument(
        "--untrusted", action="store_true",
        help="run items in locked-down processes whose results come back as JSON, never unpickled",
    )  # fmt: skip
    p.add_argument(
        "--sandbox", action="store_true",
        help="as --untrusted, and each item may read only Python and the --read paths, write only a private temp "
        "dir and the --write paths, reach no network, see no other process and gain no privilege",
    )  # fmt: skip
    p.add_argument(
        "--read", action="append", default=[], metavar="PATH", help="with --sandbox: a path items may read (repeat)"
    )
    p.add_argument(
        "--write", action="append", default=[], metavar="DIR",
        help="with --sandbox: a directory items may write in (repeat)",
    )  # fmt: skip
    p.add_argument(
        "--network", action="append", nargs="?", const=True, metavar="HOST[:PORT]",
        help="with --sandbox: alone, leave items the whole network; with a host, *.domain, address or CIDR range "
        "(and a port; else 80 and 443), only those, through procq's filtering proxy (repeat)",
    )  # fmt: skip
    p.add_argument(
        "--store", metavar="FILE",
        help="SQLite file of completed items: a re-run of the same command skips them (resume)",
    )  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary")
    return p


def main(argv: list[str], prog: str = "procq run") -> int:
    p = parser(prog)
    args = p.parse_args(argv)
    fn = _load(p, args.function)
    try:
        lane = Lane(
            workers=args.workers, timeout=args.timeout, memory_limit=args.memory_limit,
            trusted=not (args.untrusted or args.sandbox), sandbox=_sandbox(p, args),
        )  # fmt: skip
    except (TypeError, ValueError) as exc:
        p.error(str(exc))
    source = _open(p, args.input, "r")
    sink = _open(p, args.output, "w")
    kept = _keep_stdout_for_data() if sink is sys.stdout else None
    if kept is not None:
        sink = kept[0]
    tally = Tally(sys.stderr, total=_count_lines(args.input), quiet=args.quiet)
    try:
        return _run(fn, _items(source, args.text), sink, tally, lane, args)
    except SandboxUnavailable as exc:
        p.error(str(exc))
    finally:
        for f in (source, sink):
            if f not in (sys.stdin, sys.stdout):
                f.close()
        if kept is not None:
            sys.stdout.flush()
            os.dup2(kept[1], 1)
            os.close(kept[1])


def _keep_stdout_for_data() -> tuple[IO[str], int] | None:
    """The JSON lines go to stdout; what the stages print must not. Point
    file descriptor 1 at stderr, so that every worker started from here, and
    what an untrusted lane relays, prints there, and write the lines to a
    copy of the real stdout: the stream for them, and a copy to put stdout
    back from at the end. None where stdout is not descriptor 1 (a caller
    that replaced ``sys.stdout``): nothing to keep apart then."""
    try:
        if sys.stdout.fileno() != 1:
            return None
    except (AttributeError, OSError, ValueError):
        return None
    sys.stdout.flush()
    data = os.fdopen(os.dup(1), "w", encoding="utf-8")
    saved = os.dup(1)
    os.dup2(2, 1)
    return data, saved


def _sandbox(p: argparse.ArgumentParser, args: argparse.Namespace) -> Sandbox | None:
    """The lane's sandbox, from --sandbox, --read, --write and --network (paths relative to here)."""
    if not args.sandbox:
        for option in ("read", "write", "network"):
            if getattr(args, option):
                p.error(f"--{option} needs --sandbox")
        return None
    given: list[str | bool] = args.network or []
    hosts = [h for h in given if isinstance(h, str)]
    if hosts and len(hosts) < len(given):
        p.error("--network alone leaves items the whole network; --network HOST, only HOST: give one or the other")
    return Sandbox(
        read=tuple(os.path.abspath(path) for path in args.read),
        write=tuple(os.path.abspath(path) for path in args.write),
        network=hosts or bool(given),
    )


def _run(fn: Callable[[Any], Any], items: Iterator[tuple[Any, str | None]], sink: IO[str], tally: Tally,
         lane: Lane, args: argparse.Namespace) -> int:  # fmt: skip
    from procq._api.queue import ProcQueue

    name = f"{fn.__module__}:{fn.__qualname__}"
    retry = Retry(attempts=args.retry) if args.retry > 1 else None
    ended: queue.SimpleQueue[int] = queue.SimpleQueue()  # indices whose job ended (from any thread)
    out: dict[int, tuple[str, Any, bool, Any]] = {}  # index -> (key, handle, joined, item)
    users: dict[str, int] = {}  # key -> indices out on it (without a store: forget it at 0)
    window = max(WINDOW, 4 * args.workers)

    def write(index: int, key: str, outcome: Completed[Any] | Failed | dict[str, Any], cached: bool) -> None:
        line, kind = _line(index, key, outcome, cached)
        sink.write(line + "\n")
        sink.flush()
        tally.ended(kind, cached, index, key, _message(outcome))

    def settle(block: bool) -> None:
        try:
            index = ended.get(block=block, timeout=tally.refresh if block else None)
        except queue.Empty:
            tally.draw()
            return
        key, handle, joined, item = out.pop(index)
        state = handle.state
        users[key] -= 1
        if joined and isinstance(state, Failed) and state.failure.kind == "interrupted":
            # The claim it joined was a killed run's, found in the store: run it now.
            push(index, key, item)
            return
        write(index, key, state, joined)
        if not users[key]:
            del users[key]
            if store is None:
                q.forget(key)

    def push(index: int, key: str, item: Any) -> None:
        outcome = q.push(Job(key, fn, args=(item,), retry=retry))
        if isinstance(outcome, Cached):
            write(index, key, Completed(outcome.output), True)
            return
        handle = outcome.handle
        out[index] = (key, handle, isinstance(outcome, InFlight), item)
        users[key] = users.get(key, 0) + 1
        if not q._core.add_callback(handle._entry, _put(ended, index)):  # type: ignore[arg-type]
            ended.put(index)  # (it has ended already)

    store = None if args.store is None else SqliteStore(args.store, lease=LEASE)
    tally.start()
    try:
        with ProcQueue({"run": lane}, store=store, on_mismatch="ignore") as q:
            for index, (item, error) in enumerate(items):
                while len(out) >= window:
                    settle(block=True)
                key = _key(name, item)
                if error is not None:
                    write(index, key, _failure("input", error), False)
                    continue
                push(index, key, item)
                while not ended.empty():
                    settle(block=False)
            while out:
                settle(block=True)
    except KeyboardInterrupt:  # the queue closed without waiting: running jobs killed, waiting ones cancelled
        tally.finish(interrupted=True)
        return EXIT_INTERRUPTED
    tally.finish(interrupted=False)
    return EXIT_FAILED if tally.failed else EXIT_OK


def _line(
    index: int, key: str, outcome: Completed[Any] | Failed | dict[str, Any], cached: bool
) -> tuple[str, str | None]:
    """The item's JSON line, and its failure's kind (None: done). ``outcome``
    is the job's, or the fields of a failure of procq run's own (``_failure``).
    An output that is not JSON fails the item (kind "output")."""
    if type(outcome) is Completed:
        try:
            line = json.dumps(
                {"index": index, "key": key, "state": "done", "cached": cached, "output": outcome.output},
                ensure_ascii=False, allow_nan=False,
            )  # fmt: skip
            return line, None
        except (TypeError, ValueError) as exc:
            outcome = _failure("output", f"the function's result is not JSON: {exc}")
    fields = failure_fields(outcome.failure) if isinstance(outcome, Failed) else outcome
    assert isinstance(fields, dict)
    line = json.dumps({"index": index, "key": key, "state": "failed", "cached": cached, "failure": fields})
    return line, str(fields["kind"])


def _message(outcome: Completed[Any] | Failed | dict[str, Any]) -> str:
    """A failed item's message, for the summary ("" for one done)."""
    if isinstance(outcome, Failed):
        return outcome.failure.message
    if isinstance(outcome, dict):
        return str(outcome.get("message") or "")
    return ""


def _failure(kind: str, message: str) -> dict[str, Any]:
    """A failure of the item that is procq run's, not the job's: its input
    line is not JSON (``"input"``) or its output is not (``"output"``)."""
    return {"kind": kind, "message": message, "exc_type": None, "exitcode": None, "signal": None, "traceback": None}


def _put(ended: queue.SimpleQueue[int], index: int) -> Callable[[], None]:
    """A job's completion callback: its index onto the queue the main thread reads."""
    return lambda: ended.put(index)


def _key(name: str, item: Any) -> str:
    """The item's key: the function's name and a digest of the item's canonical JSON."""
    canonical = json.dumps(item, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return f"{name}:{hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()}"


def _items(source: IO[str], text: bool) -> Iterator[tuple[Any, str | None]]:
    """(item, None) for each input line, or (the line, why it is no item)."""
    for number, line in enumerate(source, 1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        if text:
            yield line, None
            continue
        try:
            yield json.loads(line), None
        except ValueError as exc:
            yield line, f"input line {number} is not JSON: {exc}"


def _load(p: argparse.ArgumentParser, spec: str) -> Callable[[Any], Any]:
    """Import ``MODULE:FUNCTION`` (the current directory first on the path,
    as ``python -m`` has it, so a module beside the input is found)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        p.error(f"the function must be given as MODULE:FUNCTION, e.g. mypkg.stage:clean; got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        p.error(f"cannot import module {module_name!r}: {exc}")
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            p.error(f"module {module_name!r} has no {attr!r}")
    if not callable(obj):
        p.error(f"{spec} is not callable (it is a {type(obj).__name__})")
    return obj  # type: ignore[no-any-return]


def _open(p: argparse.ArgumentParser, path: str, mode: str) -> IO[str]:
    if path == "-":
        return sys.stdin if mode == "r" else sys.stdout
    try:
        return open(path, mode, encoding="utf-8")  # (closed by main)
    except OSError as exc:
        p.error(f"cannot open {path}: {exc.strerror}")


def _count_lines(path: str) -> int | None:
    """The number of items of a regular file, for the progress bar (None: stdin or a pipe)."""
    if path == "-" or not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value
