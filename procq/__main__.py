"""``procq`` (and ``python -m procq``): the command line.

- ``demo``: procq's demonstration pipeline (``_cli.demo``).
- ``run``: a pipeline stage, a function over the items of a file (``_cli.run``).
- ``top``: a live view of this user's monitored queues (``_cli.top``).

Each command parses its own arguments; this only picks the command, so
``python -m procq demo ...`` behaves exactly as it always has.
"""

from __future__ import annotations

import argparse
import os
import sys

COMMANDS = {
    "run": "run a function over every item of a file in worker processes; resumable with --store",
    "demo": "watch procq run jobs that crash, hang and time out, each failing alone",
    "top": "watch this user's running queues (opened with monitor=True): lanes, workers, failures",
}


def _prog() -> str:
    """How the user called us: ``procq`` (the console script) or ``python -m procq``."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m procq" if name in ("__main__.py", "-m", "") else "procq"


def _version() -> str:
    """The installed distribution's version (the package's own, where it is run from a checkout)."""
    from importlib import metadata

    try:
        return metadata.version("procq")
    except metadata.PackageNotFoundError:
        from procq import __version__

        return __version__


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="procq: keyed jobs in supervised worker processes; a crash fails only its own job.",
        epilog=f"Run '{prog} COMMAND --help' for a command's options.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(title="commands", metavar="COMMAND")
    for name, summary in COMMANDS.items():
        sub.add_parser(name, help=summary, add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    prog = _prog()
    if args[:1] == ["demo"]:
        from procq._cli.demo import main as demo

        return demo(args[1:], prog=f"{prog} demo")
    if args[:1] == ["run"]:
        from procq._cli.run import main as run

        return run(args[1:], prog=f"{prog} run")
    if args[:1] == ["top"]:
        from procq._cli.top import main as top

        return top(args[1:], prog=f"{prog} top")
    p = _parser(prog)
    if not args:
        p.print_usage(sys.stderr)
        print(f"{prog}: error: a command is needed: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    p.parse_args(args)  # --help exits 0; an unknown command exits 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
