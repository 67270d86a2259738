"""The `knopt` command line: one subcommand per module in `knopt.commands`."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import NoReturn

from knopt.commands import COMMANDS
from knopt.errors import KnoptError, UsageError
from knopt.version import __version__

FAILED = 1  # a command that could not do its job
USAGE = 2  # a command line that asks for something that cannot be (as argparse exits)
INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C
BROKEN_PIPE = 141  # 128 + SIGPIPE, as shells report a reader that went away


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `knopt` command line; returns the process exit status.

    A knopt error, Ctrl-C or a closed output pipe (`knopt info m.onnx | head`) ends the command
    with a one-line message (or none, for the pipe) instead of a traceback.
    """
    parser = _Parser(
        prog="knopt",
        description="An optimizing compiler for neural networks (ONNX in, fused kernels out).",
    )
    parser.add_argument("--version", action="version", version=f"knopt {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(subparsers)
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _warning_line(args.command)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    """Run the chosen subcommand; map its errors to exit statuses and one-line messages."""
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
    except OSError as err:
        # A file that vanished or a disk that filled up while the command ran.
        print(f"knopt {args.command}: error: {_os_error_text(err)}", file=sys.stderr)
        return FAILED
    return status


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, as knopt's other errors are."""

    def error(self, message: str) -> NoReturn:
        """Print `knopt COMMAND: error: MESSAGE` and where the options are listed; exit 2."""
        self.exit(USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _warning_line(command: str) -> Callable[..., None]:
    """A `warnings.showwarning` that prints `knopt COMMAND: warning: MESSAGE` on stderr."""

    def show(message: Warning | str, *_: object, **__: object) -> None:
        print(f"knopt {command}: warning: {message}", file=sys.stderr)

    return show


def _os_error_text(err: OSError) -> str:
    """`path: reason` for a file-system error, without Python's `[Errno N]` prefix."""
    reason = err.strerror or str(err)
    return f"{err.filename}: {reason}" if err.filename else reason


def _silence_stdout() -> None:
    """Point stdout at the null device, so that Python's flush at exit cannot fail again."""
    # Where stdout is no file (captured by a test), there is nothing left to flush at exit.
    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
