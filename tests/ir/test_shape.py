"""Symbolic sizes: polynomial arithmetic, exact division, evaluation and broadcasting."""

from __future__ import annotations

import itertools

import pytest

from knopt.errors import InvalidGraphError, SymbolicBroadcastError, UnsupportedModelError
from knopt.ir.shape import (
    Sym,
    bind,
    broadcast_shapes,
    evaluate,
    exact_div,
    format_shape,
    is_static,
    normalize_axis,
    numel,
    static_dims,
    sym,
    symbols_of,
)

BATCH, SEQ = sym("batch"), sym("seq")
SIZES = [{"batch": b, "seq": s} for b, s in itertools.product([1, 2, 7], [1, 3, 16])]


@pytest.mark.parametrize("sizes", SIZES)
def test_arithmetic_evaluates_like_integers(sizes: dict[str, int]) -> None:
    b, s = sizes["batch"], sizes["seq"]
    cases = {
        BATCH + SEQ: b + s,
        BATCH * SEQ * 4 - 3: b * s * 4 - 3,
        2 - BATCH: 2 - b,
        (BATCH + 1) * (SEQ - 2): (b + 1) * (s - 2),
        -(BATCH * BATCH): -(b * b),
        3 * SEQ + SEQ * 3: 6 * s,
    }
    for dim, expected in cases.items():
        assert evaluate(dim, sizes) == expected


def test_results_that_are_constant_become_ints() -> None:
    assert BATCH - BATCH == 0
    assert isinstance(BATCH - BATCH, int)
    assert (BATCH + 5) - BATCH == 5
    assert BATCH * 0 == 0


def test_equal_polynomials_are_equal_and_hash_alike() -> None:
    assert BATCH * SEQ == SEQ * BATCH
    assert hash(BATCH + SEQ) == hash(SEQ + BATCH)
    assert BATCH * 2 != BATCH + 2
    assert len({BATCH * SEQ, SEQ * BATCH, BATCH}) == 2


def test_as_symbol_only_for_a_plain_name() -> None:
    assert BATCH.as_symbol() == "batch"
    for dim in (2 * BATCH, BATCH + 1, BATCH * SEQ):
        assert isinstance(dim, Sym)
        assert dim.as_symbol() is None


def test_symbols_lists_every_name() -> None:
    dim = BATCH * SEQ + 3 * SEQ + 1
    assert isinstance(dim, Sym)
    assert dim.symbols() == {"batch", "seq"}
    assert symbols_of((2, BATCH, SEQ * 4)) == {"batch", "seq"}
    assert symbols_of((2, 3)) == frozenset()


@pytest.mark.parametrize(
    ("a", "b", "quotient"),
    [
        (12, 4, 3),
        (4 * BATCH * SEQ, 2, 2 * BATCH * SEQ),
        (6 * BATCH + 9, 3, 2 * BATCH + 3),
        (BATCH * SEQ * 8, BATCH, SEQ * 8),
        (BATCH * SEQ * 8, 4 * SEQ, 2 * BATCH),
        (BATCH + SEQ, BATCH + SEQ, 1),
        (64 * BATCH * SEQ + 64 * BATCH, 16 * SEQ + 16, 4 * BATCH),
        (BATCH * BATCH + 2 * BATCH * SEQ + SEQ * SEQ, BATCH + SEQ, BATCH + SEQ),
    ],
)
def test_exact_div_divides_exactly(a: int | Sym, b: int | Sym, quotient: int | Sym) -> None:
    assert exact_div(a, b) == quotient
    for sizes in SIZES:
        assert evaluate(exact_div(a, b), sizes) * evaluate(b, sizes) == evaluate(a, sizes)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (SEQ, 3),
        (2 * BATCH + 1, 2),
        (BATCH * SEQ, SEQ + 1),
        (BATCH, SEQ),
        (5, 0),
        (SEQ, 0),
        (BATCH * SEQ + 1, SEQ + 1),
    ],
)
def test_exact_div_refuses_what_is_not_exact(a: int | Sym, b: int | Sym) -> None:
    with pytest.raises(UnsupportedModelError, match=r"fix the symbolic sizes|by zero"):
        exact_div(a, b)


def test_floor_division_of_a_sym_is_exact_division() -> None:
    assert (4 * SEQ) // 2 == 2 * SEQ
    with pytest.raises(UnsupportedModelError):
        SEQ // 3


def test_evaluate_names_a_missing_size() -> None:
    with pytest.raises(InvalidGraphError, match="'seq'"):
        evaluate(BATCH * SEQ, {"batch": 2})


def test_numel_and_bind() -> None:
    shape = (BATCH, 3, SEQ)
    assert numel(shape) == 3 * BATCH * SEQ
    assert numel(()) == 1
    assert bind(shape, {"batch": 2, "seq": 5}) == (2, 3, 5)
    assert is_static((2, 3))
    assert not is_static(shape)


def test_static_dims_are_the_integers_or_none_when_symbolic() -> None:
    assert static_dims([2, 3]) == (2, 3)
    assert static_dims(()) == ()
    assert static_dims((2, BATCH)) is None


def test_format_shape_writes_polynomials() -> None:
    assert format_shape((BATCH, 2 * SEQ + 1, 4)) == "[batch, 1 + 2*seq, 4]"
    assert str(SEQ - 1) == "-1 + seq"


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ((2, 3), (3,), (2, 3)),
        ((1, 3), (4, 1), (4, 3)),
        ((), (5, 2), (5, 2)),
        ((BATCH, 1, 4), (SEQ, 1), (BATCH, SEQ, 4)),
        ((BATCH, SEQ), (BATCH, 1), (BATCH, SEQ)),
    ],
)
def test_broadcast_follows_numpy(
    a: tuple[int | Sym, ...], b: tuple[int | Sym, ...], expected: tuple[int | Sym, ...]
) -> None:
    assert broadcast_shapes(a, b, "here") == expected
    assert broadcast_shapes(b, a, "here") == expected


@pytest.mark.parametrize(("a", "b"), [((2, 3), (4,)), ((BATCH,), (SEQ,)), ((BATCH, 2), (3, 2))])
def test_broadcast_of_mismatched_sizes_names_the_place(
    a: tuple[int | Sym, ...], b: tuple[int | Sym, ...]
) -> None:
    with pytest.raises(InvalidGraphError, match=r"node 'add'.*cannot broadcast"):
        broadcast_shapes(a, b, "node 'add'")


@pytest.mark.parametrize(("axis", "rank", "expected"), [(0, 3, 0), (-1, 3, 2), (-3, 3, 0)])
def test_normalize_axis_wraps_negative_axes(axis: int, rank: int, expected: int) -> None:
    assert normalize_axis(axis, rank, "here") == expected


@pytest.mark.parametrize(("axis", "rank"), [(3, 3), (-4, 3)])
def test_normalize_axis_refuses_out_of_range(axis: int, rank: int) -> None:
    with pytest.raises(InvalidGraphError, match="here: axis"):
        normalize_axis(axis, rank, "here")


def test_broadcast_of_differently_named_sizes_asks_to_fix_them() -> None:
    # Still an InvalidGraphError, but one that fixed sizes (dims=...) can avoid.
    with pytest.raises(SymbolicBroadcastError, match=r"node 'add'.*seq.*dims="):
        broadcast_shapes((BATCH, SEQ), (BATCH, sym("other")), "node 'add'")
    with pytest.raises(InvalidGraphError) as info:
        broadcast_shapes((2, 3), (4,), "node 'add'")
    assert not isinstance(info.value, SymbolicBroadcastError)
