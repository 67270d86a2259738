"""The `knopt` command line: one subcommand per module in `knopt.commands`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from knopt.commands import COMMANDS
from knopt.errors import KnoptError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `knopt` command line; returns the process exit status."""
    parser = argparse.ArgumentParser(
        prog="knopt",
        description="An optimizing compiler for neural networks (ONNX in, fused kernels out).",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(subparsers)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except KnoptError as err:
        print(f"knopt {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
