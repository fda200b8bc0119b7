"""``python -m procq demo``: run procq's demonstration pipeline."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["demo"]:
        from procq._demo import main as demo

        return demo(args[1:])
    print("usage: python -m procq demo", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
