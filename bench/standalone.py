"""The command line of a bench module run alone: ``python -m bench.<name>
[--quick]`` prints the module's ``run(quick)`` lines (its table and targets,
each target's line made by ``verdict``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def verdict(met: bool, what: str) -> str:
    """A target's line in a module's report: ``[MET]`` or ``[MISSED]``, then what was measured."""
    return f"[{'MET' if met else 'MISSED'}] {what}"


def main(
    name: str, doc: str, run: Callable[[bool], list[str]], argv: list[str] | None, quick: str = "a shorter run"
) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m bench.{name}", description=doc.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=quick)
    args = parser.parse_args(argv)
    print("\n".join(run(args.quick)))
    sys.stdout.flush()
