"""``python -m example_app demo [--orders N]``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m example_app")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the order pipeline on two real workers, with faults")
    demo.add_argument("--orders", type=int, default=20)
    args = parser.parse_args(argv)
    from . import demo as demo_module

    return demo_module.run(args.orders)


if __name__ == "__main__":
    sys.exit(main())
