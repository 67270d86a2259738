"""Shapes whose dimensions are integers or symbolic polynomials of named sizes.

A model exported with a dynamic batch or sequence length has dimensions like `batch` or
`4*batch*seq`. They stay symbolic through import and optimization and are bound to integers
when the graph runs (`bind`). Only what is exact is allowed: sums, products and division by a
constant that divides every coefficient. Anything else (such as `seq // 3`) raises, and the
message tells the user to fix that size when loading.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeAlias

from knopt.errors import (
    InvalidGraphError,
    SymbolicBroadcastError,
    SymbolicSizeError,
    UnsupportedModelError,
)

Monomial: TypeAlias = tuple[str, ...]  # sorted symbol names, repeated for powers; () is 1
_DIVISION_STEPS = 256  # terms a polynomial quotient may have: far beyond any model's sizes


@dataclass(frozen=True)
class Sym:
    """A polynomial of named sizes with integer coefficients, such as `2*batch*seq + 1`.

    Build them with `sym("batch")` and ordinary arithmetic; results that are constant come back
    as plain `int`.
    """

    terms: tuple[tuple[Monomial, int], ...]

    @staticmethod
    def _make(terms: Mapping[Monomial, int]) -> Dim:
        kept = tuple(sorted((m, c) for m, c in terms.items() if c != 0))
        if not kept:
            return 0
        if len(kept) == 1 and kept[0][0] == ():
            return kept[0][1]
        return Sym(kept)

    def _dict(self) -> dict[Monomial, int]:
        return dict(self.terms)

    def __add__(self, other: Dim) -> Dim:
        terms = self._dict()
        for m, c in _as_terms(other).items():
            terms[m] = terms.get(m, 0) + c
        return Sym._make(terms)

    __radd__ = __add__

    def __neg__(self) -> Dim:
        return Sym._make({m: -c for m, c in self.terms})

    def __sub__(self, other: Dim) -> Dim:
        return self + (-other)

    def __rsub__(self, other: Dim) -> Dim:
        return (-self) + other

    def __mul__(self, other: Dim) -> Dim:
        terms: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in _as_terms(other).items():
                m = tuple(sorted(m1 + m2))
                terms[m] = terms.get(m, 0) + c1 * c2
        return Sym._make(terms)

    __rmul__ = __mul__

    def __floordiv__(self, other: Dim) -> Dim:
        return exact_div(self, other)

    def __str__(self) -> str:
        parts = []
        for m, c in self.terms:
            factors = ([str(c)] if c != 1 or not m else []) + list(m)
            parts.append("*".join(factors))
        return " + ".join(parts).replace("+ -", "- ")

    def as_symbol(self) -> str | None:
        """The name, if this polynomial is exactly one symbol (like `batch`), else None."""
        if len(self.terms) == 1 and self.terms[0][1] == 1 and len(self.terms[0][0]) == 1:
            return self.terms[0][0][0]
        return None

    def symbols(self) -> frozenset[str]:
        """The names this polynomial mentions."""
        return frozenset(name for m, _ in self.terms for name in m)


Dim: TypeAlias = int | Sym
Shape: TypeAlias = tuple[Dim, ...]


def sym(name: str) -> Sym:
    """The symbolic size called `name`."""
    result = Sym._make({(name,): 1})
    assert isinstance(result, Sym)
    return result


def _as_terms(dim: Dim) -> dict[Monomial, int]:
    if isinstance(dim, Sym):
        return dict(dim.terms)
    return {(): int(dim)} if dim else {}


def is_static(shape: Iterable[Dim]) -> bool:
    """True when every dimension is an integer."""
    return all(isinstance(d, int) for d in shape)


def static_dims(shape: Iterable[Dim]) -> tuple[int, ...] | None:
    """The dimensions of `shape` as integers, or None if one is symbolic (see `is_static`)."""
    dims = tuple(shape)
    ints = tuple(d for d in dims if isinstance(d, int))
    return ints if len(ints) == len(dims) else None


def symbols_of(shape: Iterable[Dim]) -> frozenset[str]:
    """All symbol names used by the dimensions of `shape`."""
    return frozenset().union(*(d.symbols() for d in shape if isinstance(d, Sym)))


def numel(shape: Iterable[Dim]) -> Dim:
    """The number of elements of a shape."""
    total: Dim = 1
    for d in shape:
        total = total * d
    return total


def exact_div(a: Dim, b: Dim) -> Dim:
    """`a // b` where the division is known to be exact.

    Raises:
        UnsupportedModelError: If the quotient is not an exact polynomial.
    """
    if isinstance(b, int) and isinstance(a, int):
        if b == 0:
            raise UnsupportedModelError(f"division of size {a} by zero")
        return a // b
    if isinstance(b, int) and b != 0:
        terms = _as_terms(a)
        if all(c % b == 0 for c in terms.values()):
            return Sym._make({m: c // b for m, c in terms.items()})
    if a == b:
        return 1
    if isinstance(b, Sym):
        quotient = _divide_polynomials(_as_terms(a), dict(b.terms))
        if quotient is not None:
            return Sym._make(quotient)
    # x.view(batch, -1) of a mask whose batch the exporter named apart: (m0 * m1) / b.
    divisor = b.as_symbol() if isinstance(b, Sym) else None
    same = tuple((divisor, name) for name in sorted(_symbols(a)) if divisor is not None)
    raise SymbolicSizeError(
        f"size ({a}) / ({b}) is not exact; fix the symbolic sizes when loading "
        f"(for example dims={{'batch': 1}})",
        same,
    )


def _divide_monomial(m: Monomial, by: Monomial) -> Monomial | None:
    rest = list(m)
    for name in by:
        if name not in rest:
            return None
        rest.remove(name)
    return tuple(rest)


def _divide_polynomials(
    a: dict[Monomial, int], b: dict[Monomial, int]
) -> dict[Monomial, int] | None:
    """The exact quotient `a / b` of two polynomials, or None if `b` does not divide `a`.

    Long division on the leading terms (largest degree, then names): exact division of
    polynomials never needs a remainder, and each step removes `a`'s leading term (the order
    is graded, so what it adds is smaller). `(64*batch*past + 64*batch*seq) / (16*past +
    16*seq)` is `4*batch`.
    """
    lead_b = max(b, key=lambda m: (len(m), m))
    rest, quotient = dict(a), dict[Monomial, int]()
    for _ in range(_DIVISION_STEPS):
        if not rest:
            return quotient
        lead = max(rest, key=lambda m: (len(m), m))
        factor = _divide_monomial(lead, lead_b)
        if factor is None or rest[lead] % b[lead_b]:
            return None
        coefficient = rest[lead] // b[lead_b]
        quotient[factor] = quotient.get(factor, 0) + coefficient
        for m, c in b.items():
            term = tuple(sorted(factor + m))
            rest[term] = rest.get(term, 0) - coefficient * c
            if rest[term] == 0:
                del rest[term]
    return None


def evaluate(dim: Dim, sizes: Mapping[str, int]) -> int:
    """The integer value of `dim` with the named sizes substituted.

    Raises:
        InvalidGraphError: If a size that `dim` needs is missing.
    """
    if isinstance(dim, int):
        return dim
    total = 0
    for m, c in dim.terms:
        term = c
        for name in m:
            if name not in sizes:
                raise InvalidGraphError(f"symbolic size '{name}' has no value")
            term *= sizes[name]
        total += term
    return total


def bind(shape: Iterable[Dim], sizes: Mapping[str, int]) -> tuple[int, ...]:
    """`shape` with every symbolic dimension evaluated."""
    return tuple(evaluate(d, sizes) for d in shape)


def format_shape(shape: Iterable[Dim]) -> str:
    """A shape as text, such as `[batch, 3, 224, 224]`."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


def broadcast_shapes(a: Shape, b: Shape, where: str) -> Shape:
    """The numpy broadcast of two shapes (ranks aligned on the right).

    Raises:
        InvalidGraphError: If the shapes cannot broadcast.
    """
    rank = max(len(a), len(b))
    a = (1,) * (rank - len(a)) + tuple(a)
    b = (1,) * (rank - len(b)) + tuple(b)
    out: list[Dim] = []
    for da, db in zip(a, b, strict=True):
        if da == db or db == 1:
            out.append(da)
        elif da == 1:
            out.append(db)
        elif isinstance(da, int) and isinstance(db, int):
            raise InvalidGraphError(
                f"{where}: shapes {format_shape(a)} and {format_shape(b)} cannot broadcast "
                f"(dimension {da} against {db}); each axis must match or be 1, so check the "
                "input shapes and the sizes given when loading"
            )
        else:
            # Different names for what is (at run time) usually the same size, as exporters
            # write them: only the sizes of an actual run can say.
            raise SymbolicBroadcastError(
                f"{where}: shapes {format_shape(a)} and {format_shape(b)} cannot broadcast "
                f"(dimension {da} against {db}); each axis must match or be 1, so check the "
                "input shapes and the sizes given when loading: if these sizes are equal, "
                "fix them with dims=... (or --dims NAME=SIZE)",
                _symbol_pair(da, db),
            )
    return tuple(out)


def _symbol_pair(a: Dim, b: Dim) -> tuple[tuple[str, str], ...]:
    first = a.as_symbol() if isinstance(a, Sym) else None
    second = b.as_symbol() if isinstance(b, Sym) else None
    return ((first, second),) if first is not None and second is not None else ()


def _symbols(dim: Dim) -> frozenset[str]:
    return dim.symbols() if isinstance(dim, Sym) else frozenset()


def normalize_axis(axis: int, rank: int, where: str) -> int:
    """`axis` made non-negative for a tensor of `rank` dimensions.

    Raises:
        InvalidGraphError: If the axis is out of range.
    """
    if not -rank <= axis < max(rank, 1):
        raise InvalidGraphError(f"{where}: axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0
