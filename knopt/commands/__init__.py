"""The subcommands of `knopt`. Each module has `add_parser(subparsers)` that sets `run`."""

from types import ModuleType

from knopt.commands import demo, optimize

COMMANDS: list[ModuleType] = [demo, optimize]

__all__ = ["COMMANDS"]
