"""Argument helpers shared by the subcommands.

Values that argparse checks (`positive_int`, `positive_float`) fail as argparse errors; values
checked against the model or the file system fail as `UsageError`. Both exit with status 2,
before any work is done.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from knopt.errors import InputError, UsageError
from knopt.ir.dims import SizeProfile, SizeRange, parse_range_text


def positive_int(text: str) -> int:
    """An argparse `type=` for counts: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def positive_float(text: str) -> float:
    """An argparse `type=` for durations: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a number above 0")
    return value


def parse_dims(items: Sequence[str], symbols: Iterable[str]) -> dict[str, int]:
    """`["batch=2", "seq=128"]` as `{"batch": 2, "seq": 128}`, each a size the model names.

    Raises:
        UsageError: If an item is not NAME=SIZE with a positive integer size, or the model has
            no symbolic size NAME.
    """
    dims: dict[str, int] = {}
    for item in items:
        name, _, size = item.partition("=")
        if not name or not size.isdigit() or int(size) < 1:
            raise UsageError(f"--dims {item!r}: expected NAME=SIZE with a positive size")
        dims[name] = int(size)
    try:
        SizeProfile.parse(dims, symbols)
    except InputError as err:
        raise _dims_error(err) from err
    return dims


def parse_ranges(items: Sequence[str]) -> dict[str, SizeRange]:
    """`["batch=2", "seq=1:128:512"]` as sizes fixed (min = max) or ranged (min, opt, max).

    Raises:
        UsageError: If an item is neither NAME=SIZE nor NAME=MIN:OPT:MAX.
    """
    try:
        return dict(parse_range_text(item) for item in items)
    except InputError as err:
        raise _dims_error(err) from err


def size_profile(items: Sequence[str], symbols: Iterable[str]) -> SizeProfile:
    """The `--dims` items as a profile of the model's symbolic sizes.

    Raises:
        UsageError: If an item is malformed or names a size the model does not have (a typo
            such as `bach=2` is refused, not ignored).
    """
    ranges = parse_ranges(items)
    try:
        return SizeProfile.parse(ranges, symbols)
    except InputError as err:
        raise _dims_error(err) from err


def _dims_error(err: InputError) -> UsageError:
    """A size-profile error, as a command-line error about `--dims`."""
    text = str(err).removeprefix("dims: ")
    return UsageError(text if text.startswith("--dims") else f"--dims: {text}")


def check_writable(flag: str, path: Path | None) -> None:
    """Refuse, before any work, an output path that cannot be written.

    Raises:
        UsageError: If `path` is a folder, its folder is missing, or it is not writable.
    """
    problem = None if path is None else unwritable(path)
    if problem:
        raise UsageError(f"{flag} {path}: {problem}")


def unwritable(path: Path) -> str | None:
    """Why `path` cannot be written (a folder, a missing or read-only folder), or None."""
    folder = path.parent
    if path.is_dir():
        return "is a folder; give a file name"
    if not folder.is_dir():
        return f"folder {folder} does not exist"
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return "not writable; choose another path"
    return None
