"""The subcommands of `knopt`. Each module has `add_parser(subparsers)` that sets `run`."""

from types import ModuleType

from knopt.commands import calibrate, check_rules, compile, demo, info, optimize, run, serve

COMMANDS: list[ModuleType] = [demo, optimize, info, run, calibrate, check_rules, compile, serve]

__all__ = ["COMMANDS"]
