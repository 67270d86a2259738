"""Binding symbolic sizes: reading them off input shapes, and making a static copy."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from knopt.cpu.executor import run_graph
from knopt.errors import InputError, InvalidGraphError
from knopt.ir import DType, Graph, GraphBuilder, Unary, bind_symbols, infer_sizes, sym, validate
from knopt.ir.bind import ProgramBinder, bind_attributes
from knopt.ir.op import Iota, Sizes, TensorType
from knopt.ir.program import Tensor, program_from_graph
from knopt.ir.shape import bind, is_static

F32 = DType.F32
BATCH, SEQ = sym("batch"), sym("seq")


def _graph() -> Graph:
    b = GraphBuilder("symbolic")
    x = b.input("x", (BATCH, SEQ, 4), F32)
    mask = b.input("mask", (BATCH, SEQ), F32)
    flat = b.view(b.unary(Unary.TANH, x), (BATCH * SEQ, 4))
    b.output(b.view(flat, (BATCH, SEQ * 4)), "flat")
    b.output(b.add(x, b.view(mask, (BATCH, SEQ, 1))), "masked")
    b.output(b.apply(Sizes((BATCH, SEQ * 4))), "sizes")
    b.output(b.apply(Iota(SEQ, DType.I32)), "positions")
    return b.build()


def test_infer_sizes_reads_each_symbol_off_the_inputs() -> None:
    sizes = infer_sizes(_graph(), {"x": (2, 5, 4), "mask": (2, 5)})
    assert sizes == {"batch": 2, "seq": 5}


def test_missing_input_is_named() -> None:
    with pytest.raises(InputError, match="input 'mask' is missing"):
        infer_sizes(_graph(), {"x": (2, 5, 4)})


def test_wrong_rank_is_named_with_the_expected_shape() -> None:
    with pytest.raises(
        InputError, match=r"input 'x' has shape \[2, 5\], expected \[batch, seq, 4\]"
    ):
        infer_sizes(_graph(), {"x": (2, 5), "mask": (2, 5)})


def test_wrong_static_size_is_named() -> None:
    with pytest.raises(InputError, match=r"input 'x' has shape \[2, 5, 3\]"):
        infer_sizes(_graph(), {"x": (2, 5, 3), "mask": (2, 5)})


def test_conflicting_sizes_are_named() -> None:
    with pytest.raises(InputError, match="size 'seq' is 6 here but 5"):
        infer_sizes(_graph(), {"x": (2, 5, 4), "mask": (2, 6)})


def test_size_only_inside_products_cannot_be_read() -> None:
    b = GraphBuilder()
    x = b.input("x", (2 * sym("n"),), F32)
    b.output(b.unary(Unary.NEG, x), "y")
    with pytest.raises(InputError, match="cannot read sizes"):
        infer_sizes(b.build(), {"x": (6,)})


def test_bound_graph_is_static_valid_and_runs_like_the_symbolic_one(
    rng: np.random.Generator,
) -> None:
    graph = _graph()
    bound = bind_symbols(graph, {"batch": 3, "seq": 2})
    validate(bound)
    assert all(is_static(v.shape) for v in bound.values())
    assert graph.symbols() == {"batch", "seq"}  # the original is left alone
    x = rng.standard_normal((3, 2, 4)).astype(np.float32)
    mask = rng.standard_normal((3, 2)).astype(np.float32)
    flat, masked, sizes, positions = run_graph(bound, {"x": x, "mask": mask})
    np.testing.assert_allclose(flat, np.tanh(x).reshape(3, 8), rtol=1e-6)
    np.testing.assert_allclose(masked, x + mask[:, :, None])
    assert sizes.tolist() == [3, 8]
    assert positions.dtype == np.int32
    assert positions.tolist() == [0, 1]


def test_bound_graph_keeps_names() -> None:
    bound = bind_symbols(_graph(), {"batch": 1, "seq": 1})
    assert bound.input_names == ["x", "mask"]
    assert bound.output_names == ["flat", "masked", "sizes", "positions"]
    assert {n.name for n in bound.nodes} >= {"x", "mask"}


def test_a_program_binder_binds_every_size_and_shares_what_holds_none() -> None:
    program = program_from_graph(_graph())
    binder = ProgramBinder(program)
    for sizes in ({"batch": 2, "seq": 5}, {"batch": 1, "seq": 1}, {"batch": 7, "seq": 3}):
        bound = binder.bind(sizes)
        for old, new in zip(program.tensors, bound.tensors, strict=True):
            assert new == Tensor(
                old.id, TensorType(bind(old.type.shape, sizes), old.type.dtype), old.role
            )
            if is_static(old.type.shape):
                assert new is old
        for kernel, bound_kernel in zip(program.kernels, bound.kernels, strict=True):
            op = bind_attributes(kernel.op, sizes)
            assert bound_kernel == dataclasses.replace(kernel, op=op)
            assert repr(bound_kernel.op) == repr(op)  # alike too (1 and 1.0 would compare equal)
            if op == kernel.op:
                assert bound_kernel is kernel
        assert (bound.inputs, bound.outputs) == (program.inputs, program.outputs)
        assert bound.constants is program.constants


def test_a_program_binder_names_a_missing_size() -> None:
    with pytest.raises(InvalidGraphError, match="symbolic size 'seq' has no value"):
        ProgramBinder(program_from_graph(_graph())).bind({"batch": 2})
