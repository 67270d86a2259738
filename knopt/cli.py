"""The `knopt` command line: one subcommand per module in `knopt.commands`."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from collections.abc import Sequence

from knopt.commands import COMMANDS
from knopt.errors import KnoptError, UsageError

FAILED = 1  # a command that could not do its job
USAGE = 2  # a command line that asks for something that cannot be (as argparse exits)
INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C
BROKEN_PIPE = 141  # 128 + SIGPIPE, as shells report a reader that went away


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `knopt` command line; returns the process exit status.

    A knopt error, Ctrl-C or a closed output pipe (`knopt info m.onnx | head`) ends the command
    with a one-line message (or none, for the pipe) instead of a traceback.
    """
    parser = argparse.ArgumentParser(
        prog="knopt",
        description="An optimizing compiler for neural networks (ONNX in, fused kernels out).",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(subparsers)
    args = parser.parse_args(argv)
    try:
        status = int(args.run(args) or 0)
        sys.stdout.flush()  # a closed pipe fails here, inside the handlers, not at exit
    except UsageError as err:
        print(f"knopt {args.command}: error: {err}", file=sys.stderr)
        return USAGE
    except KnoptError as err:
        print(f"knopt {args.command}: error: {err}", file=sys.stderr)
        return FAILED
    except KeyboardInterrupt:
        print(f"knopt {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return BROKEN_PIPE
    return status


def _silence_stdout() -> None:
    """Point stdout at the null device, so that Python's flush at exit cannot fail again."""
    # Where stdout is no file (captured by a test), there is nothing left to flush at exit.
    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
