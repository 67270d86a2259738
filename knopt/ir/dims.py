"""Size profiles: the range of each named symbolic size a session accepts, as TensorRT's are.

    dims = {"batch": (1, 8, 64), "seq": (1, 128, 512), "heads": 12}

A range is (min, opt, max): sizes outside it are refused, and `opt` is the size the optimizer
costs kernels at (the program stays symbolic and serves the whole range). A plain integer
fixes a size. A size the profile does not name is accepted at any value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from knopt.errors import InputError


@dataclass(frozen=True)
class SizeRange:
    """The sizes one symbolic dimension may take: `min <= opt <= max`, all at least 0."""

    min: int
    opt: int
    max: int

    def __str__(self) -> str:
        if self.min == self.max:
            return str(self.min)
        return f"{self.min}:{self.opt}:{self.max}"

    def contains(self, size: int) -> bool:
        """True when `size` lies in the range."""
        return self.min <= size <= self.max


def parse_range(name: str, spec: object) -> SizeRange:
    """One size's range from an int (fixed), a (min, opt, max) tuple, or a `SizeRange`.

    Raises:
        InputError: If the numbers are not integers with `0 <= min <= opt <= max`.
    """
    if isinstance(spec, SizeRange):
        values: tuple[object, ...] = (spec.min, spec.opt, spec.max)
    elif isinstance(spec, int) and not isinstance(spec, bool):
        values = (spec, spec, spec)
    elif isinstance(spec, tuple | list) and len(spec) == 3:
        values = tuple(spec)
    else:
        raise InputError(f"size '{name}': {spec!r} is neither a size nor a (min, opt, max) range")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise InputError(f"size '{name}': {spec!r} must hold integers")
    low, opt, high = (int(v) for v in values)  # type: ignore[call-overload]
    if not 0 <= low <= opt <= high:
        raise InputError(f"size '{name}': need 0 <= min <= opt <= max, got {low}, {opt}, {high}")
    return SizeRange(low, opt, high)


def parse_range_text(text: str) -> tuple[str, SizeRange]:
    """A command line's `NAME=SIZE` or `NAME=MIN:OPT:MAX` (such as `seq=1:128:512`).

    Raises:
        InputError: If the text has another form.
    """
    name, _, value = text.partition("=")
    parts = value.split(":")
    fixed_zero = len(parts) == 1 and parts[0].isdigit() and int(parts[0]) == 0
    if not name or len(parts) not in (1, 3) or not all(p.isdigit() for p in parts) or fixed_zero:
        raise InputError(
            f"--dims {text!r}: expected NAME=SIZE (a positive size) or NAME=MIN:OPT:MAX"
        )
    numbers = [int(p) for p in parts]
    spec: int | tuple[int, ...] = numbers[0] if len(numbers) == 1 else tuple(numbers)
    return name, parse_range(name, spec)


@dataclass(frozen=True)
class SizeProfile:
    """The accepted range of named symbolic sizes (a TensorRT optimization profile).

    Attributes:
        ranges: Each constrained size's range, by name.
    """

    ranges: Mapping[str, SizeRange]

    @staticmethod
    def parse(dims: Mapping[str, object] | None, symbols: Iterable[str]) -> SizeProfile:
        """The profile of `dims` for a model whose symbolic sizes are `symbols`.

        Raises:
            InputError: If a name is not one of `symbols` (a misspelling, most likely) or a
                range is malformed.
        """
        known = sorted(set(symbols))
        ranges: dict[str, SizeRange] = {}
        for name, spec in (dims or {}).items():
            if name not in known:
                sizes = ", ".join(known) if known else "none: all its sizes are fixed"
                raise InputError(f"dims: the model has no size '{name}' (its sizes: {sizes})")
            ranges[name] = parse_range(name, spec)
        return SizeProfile(ranges)

    @property
    def fixed(self) -> dict[str, int]:
        """The sizes the profile fixes (min == max)."""
        return {n: r.min for n, r in self.ranges.items() if r.min == r.max}

    @property
    def representative(self) -> dict[str, int]:
        """The size kernels are costed at: each range's `opt`."""
        return {n: r.opt for n, r in self.ranges.items()}

    def check(self, sizes: Mapping[str, int]) -> None:
        """Refuse sizes outside the profile.

        Raises:
            InputError: Naming the size, its value and its range.
        """
        for name, size in sizes.items():
            allowed = self.ranges.get(name)
            if allowed is not None and not allowed.contains(size):
                raise InputError(
                    f"size '{name}' is {size}, outside the session's range "
                    f"{allowed.min}..{allowed.max} (compile with a wider dims={{'{name}': "
                    "(min, opt, max)})"
                )

    def __str__(self) -> str:
        return ", ".join(f"{n}={r}" for n, r in self.ranges.items())
