"""Argument helpers shared by the subcommands.

Values that argparse checks (`positive_int`, `positive_float`) fail as argparse errors; values
checked against the model or the file system fail as `UsageError`. Both exit with status 2,
before any work is done.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
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


class Status:
    """A status line on stderr for work that may take more than a second.

    Shown only where stderr is a terminal and the user did not ask for `--quiet`, and only once
    the command has run for a second: a background thread redraws the latest line with the time
    so far, in place. Use it as a context manager; on exit the line is erased, so that what the
    command prints next starts on a clean line.

        with Status("optimize", quiet=args.quiet) as status:
            status("loading the model")
    """

    DELAY = 1.0  # seconds before the first line: quick commands show nothing
    REFRESH = 0.25  # seconds between redraws

    def __init__(self, command: str, quiet: bool = False) -> None:
        self.command = command
        self.enabled = not quiet and sys.stderr.isatty()
        self._began = time.perf_counter()
        self._line = ""
        self._shown = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._redraw, daemon=True)

    def __call__(self, line: str) -> None:
        """Make `line` the current status."""
        self._line = line

    def __enter__(self) -> Status:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        if not self.enabled:
            return
        self._stop.set()
        self._thread.join()
        with self._lock:
            if self._shown:
                sys.stderr.write("\r\x1b[K")
                sys.stderr.flush()

    def _redraw(self) -> None:
        if self._stop.wait(self.DELAY):
            return
        while True:
            elapsed = time.perf_counter() - self._began
            with self._lock:
                sys.stderr.write(f"\r\x1b[Kknopt {self.command}: {self._line} ({elapsed:.0f} s)")
                sys.stderr.flush()
                self._shown = True
            if self._stop.wait(self.REFRESH):
                return
