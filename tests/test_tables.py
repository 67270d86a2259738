"""Every table keyed by op, op group or kernel kind is complete, and agrees with schema.egg.

Each interpretation of the IR keeps its own table (CONTRIBUTING.md lists them); a table that
misses a member fails here, naming the member, instead of failing quietly later. (The CPU
kernels, ONNX exporters and GPU lowerings are checked beside their code: tests/cpu,
tests/onnx/test_export.py and tests/cuda/test_planner.py.)
"""

from __future__ import annotations

import enum
import re
from typing import Any

import pytest

from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph
from knopt.ir.kernel import FUSED_MAIN_OPS, KERNEL_CONSTRUCTORS, KernelKind
from knopt.ir.op import OP_CLASSES, Binary, PadMode, PoolKind, Reduction, ScatterReduction, Unary
from knopt.ir.program import ELEMENTWISE_EXPRS
from knopt.opt.cost import FLOPS, FREE_OPS
from knopt.opt.rules import rules_dir
from knopt.opt.serialized import Ref
from knopt.opt.terms import (
    DECODERS,
    ENCODERS,
    ENUM_PREFIX,
    LEAF_TERMS,
    SPLAT,
    Lit,
    Term,
    TermTables,
    enum_constructor,
    enum_member,
    graph_commands,
)
from knopt.testing import graph_from_seed
from knopt.testing.rulecheck.sampler import SAMPLERS

OP_NAMES = frozenset(cls.__name__ for cls in OP_CLASSES)
# schema.egg's name for each IR enum (the datatype its members are constructors of).
SCHEMA_ENUMS: dict[type[enum.Enum], str] = {
    DType: "DType",
    Unary: "UnaryKind",
    Binary: "BinaryKind",
    Reduction: "Reduction",
    PoolKind: "PoolKind",
    PadMode: "PadMode",
    ScatterReduction: "ScatterReduction",
}


def _missing(table: str, expected: set[Any] | frozenset[Any], actual: set[Any]) -> str:
    def names(items: set[Any]) -> list[str]:
        return sorted(getattr(i, "__name__", str(i)) for i in items)

    return f"{table} lacks {names(set(expected) - actual)} and has extra {names(actual - expected)}"


# ---- schema.egg ---------------------------------------------------------------------------


def _sexprs(text: str) -> list[Any]:
    """The top-level s-expressions of egglog text (atoms as strings, lists as lists)."""
    tokens = re.findall(r'\(|\)|"[^"]*"|[^\s()]+', re.sub(r";[^\n]*", "", text))
    stack: list[list[Any]] = [[]]
    for token in tokens:
        if token == "(":
            stack.append([])
        elif token == ")":
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(token)
    return stack[0]


def _schema() -> list[Any]:
    return _sexprs((rules_dir() / "schema.egg").read_text())


def _datatype(name: str) -> list[str]:
    """The constructor names of a datatype of schema.egg (`datatype` or within `datatype*`)."""
    for form in _schema():
        if form[0] == "datatype" and form[1] == name:
            return [c[0] for c in form[2:]]
        if form[0] == "datatype*":
            for sort in form[1:]:
                if sort[0] == name:
                    return [c[0] for c in sort[1:] if c[0] != "sort"]
    raise AssertionError(f"schema.egg declares no datatype {name}")


def test_schema_has_a_term_per_ir_op_and_kernel_kind() -> None:
    actual = set(_datatype("T"))
    expected = OP_NAMES | {SPLAT} | KERNEL_CONSTRUCTORS
    assert actual == expected, _missing("schema.egg's datatype T", expected, actual)


def test_typing_gives_every_ir_term_a_type() -> None:
    # Kernel terms join the classes of the tensors they compute, which are typed already.
    text = re.sub(r";[^\n]*", "", (rules_dir() / "typing.egg").read_text())
    untyped = {name for name in OP_NAMES | {SPLAT} if not re.search(rf"\({name}\s", text)}
    assert not untyped, f"rules/typing.egg gives no shape or dtype to {sorted(untyped)}"


def test_schema_enums_match_the_ir_enums() -> None:
    assert set(SCHEMA_ENUMS) == set(ENUM_PREFIX), _missing(
        "SCHEMA_ENUMS", set(ENUM_PREFIX), set(SCHEMA_ENUMS)
    )
    for kind, datatype in SCHEMA_ENUMS.items():
        expected = {enum_constructor(member) for member in kind}
        actual = set(_datatype(datatype))
        assert actual == expected, _missing(f"schema.egg's datatype {datatype}", expected, actual)
        assert all(enum_member(kind, enum_constructor(m)) is m for m in kind)


def test_op_groups_and_kernel_kinds_are_ir_ops() -> None:
    for group in (ops.LEAF_OPS, ops.VIEW_OPS, ops.ELEMENTWISE_OPS, FUSED_MAIN_OPS):
        assert group <= set(OP_CLASSES), _missing("OP_CLASSES", group, set(OP_CLASSES))
    for kind in KernelKind:
        assert KernelKind.of_name(kind) is kind
        assert KernelKind.of_constructor(kind.constructor) is kind
        assert kind.main_op is None or KernelKind.of_main_op(kind.main_op) is kind


# ---- the e-graph bridge -------------------------------------------------------------------


def test_every_ir_op_has_an_encoder() -> None:
    assert set(ENCODERS) == set(OP_CLASSES), _missing("ENCODERS", set(OP_CLASSES), set(ENCODERS))


def test_every_ir_op_has_a_decoder() -> None:
    # Inputs, constants and opaque ops are rebuilt from their tables, not decoded.
    expected = OP_NAMES - {ops.Input.__name__, ops.Constant.__name__, ops.Opaque.__name__}
    assert set(DECODERS) == expected, _missing("DECODERS", expected, set(DECODERS))


def _graphs_covering_every_op() -> list[Graph]:
    found: list[Graph] = []
    seen: set[type[ops.Op]] = set()
    for seed in range(2000):
        graph = graph_from_seed(seed).graph
        new = {type(n.op) for n in graph.nodes} - seen
        if new:
            found.append(graph)
            seen |= new
        if seen >= set(OP_CLASSES):
            return found
    raise AssertionError(
        f"no random graph has {sorted(c.__name__ for c in set(OP_CLASSES) - seen)}"
    )


def _decoded(arg: Any) -> Any:
    """A term argument as the serialized e-graph gives it to decoders (`knopt.opt.serialized`)."""
    if isinstance(arg, Lit):
        return arg.value
    assert isinstance(arg, Term)
    if arg.name in ("vec-of", "vec-empty"):
        return tuple(_decoded(a) for a in arg.args)
    if not arg.args and arg.name not in OP_NAMES:
        return arg.name  # an enum member
    return Ref(0)  # a tensor


@pytest.mark.parametrize("graph", _graphs_covering_every_op(), ids=lambda g: g.name)
def test_encoders_write_the_schema_constructor_that_decodes_back(graph: Graph) -> None:
    tables = TermTables()
    terms = graph_commands(graph, tables).terms
    for node, term in zip(graph.nodes, terms, strict=True):
        name = type(node.op).__name__
        if isinstance(node.op, ops.Constant):
            assert term.name in (name, SPLAT)
            continue
        assert term.name == name, f"ENCODERS[{name}] writes a {term.name} term"
        if name in DECODERS:
            decoded = DECODERS[name](tables, tuple(_decoded(a) for a in term.args))
            assert decoded == node.op, f"DECODERS[{name}] gives {decoded}, not {node.op}"


def test_every_constructor_that_costs_has_a_flop_count() -> None:
    expected = (OP_NAMES | {SPLAT} | KERNEL_CONSTRUCTORS) - FREE_OPS
    assert set(FLOPS) == expected, _missing("FLOPS (knopt/opt/cost.py)", expected, set(FLOPS))
    assert LEAF_TERMS <= FREE_OPS


# ---- interpretations ----------------------------------------------------------------------


def test_every_elementwise_op_has_a_scalar_body() -> None:
    assert set(ELEMENTWISE_EXPRS) == ops.ELEMENTWISE_OPS, _missing(
        "ELEMENTWISE_EXPRS", ops.ELEMENTWISE_OPS, set(ELEMENTWISE_EXPRS)
    )


def test_every_schema_constructor_has_a_sampler() -> None:
    expected = OP_NAMES | {SPLAT}
    assert set(SAMPLERS) == expected, _missing(
        "SAMPLERS (knopt/testing/rulecheck/sampler.py)", expected, set(SAMPLERS)
    )
