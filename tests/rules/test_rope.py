"""rules/rope.egg: the rotary embedding template becomes one Rope op, and one kernel."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import knopt
from knopt.cpu import run_graph
from knopt.ir import DType, GraphBuilder, Unary, Value, bind_symbols
from knopt.ir import op as ops
from knopt.ir.program import Program
from tests.oracle import assert_same, random_array, run_onnxruntime
from tests.rules.helpers import F32, optimize_and_compare

DECODERS = Path(__file__).parents[1] / "fixtures" / "decoder"
_RULES = ("rotate-half", "rope")


@dataclass(frozen=True)
class Spelling:
    """How a template is written: operand orders, and where its cos and sin tables come from.

    Attributes:
        cos_first: Each product is `cos * x` and `sin * rotate_half(x)` instead.
        rotated_first: The sum is `rotated + kept` instead.
        tables_vary: cos and sin are inputs (computed from positions in a decoder), else
            constants.
    """

    cos_first: bool = False
    rotated_first: bool = False
    tables_vary: bool = True


def _rotate_half(g: GraphBuilder, x: Value, *, axis: int = -1, negate_upper: bool = True) -> Value:
    """concat(-x[..., h:], x[..., :h]) over `axis` (or the halves' signs swapped)."""
    axis %= x.rank
    size = x.shape[axis]
    assert isinstance(size, int)
    h = size // 2
    lower = g.slice(x, axis=axis, start=0, stop=h)
    upper = g.slice(x, axis=axis, start=h, stop=2 * h)
    if negate_upper:
        return g.concat([g.unary(Unary.NEG, upper), lower], axis=axis)
    return g.concat([upper, g.unary(Unary.NEG, lower)], axis=axis)


def _table(g: GraphBuilder, name: str, shape: tuple[int, ...], dtype: DType, vary: bool) -> Value:
    """A per-position table `[seq, head]`, broadcast over the leading axes by the products."""
    if vary:
        return g.input(name, shape[-2:], dtype)
    angles = np.linspace(-3.0, 3.0, shape[-2] * shape[-1]).reshape(shape[-2:])
    values = np.cos(angles) if name == "cos" else np.sin(angles)
    return g.constant(values.astype(dtype.numpy))


def _rope_template(
    g: GraphBuilder, shape: tuple[int, ...], dtype: DType, spelling: Spelling
) -> Value:
    x = g.input("x", shape, dtype)
    cos = g.broadcast(_table(g, "cos", shape, dtype, spelling.tables_vary), shape)
    sin = g.broadcast(_table(g, "sin", shape, dtype, spelling.tables_vary), shape)
    rotated = _rotate_half(g, x)
    if spelling.cos_first:
        kept, turned = g.mul(cos, x), g.mul(sin, rotated)
    else:
        kept, turned = g.mul(x, cos), g.mul(rotated, sin)
    return g.add(turned, kept) if spelling.rotated_first else g.add(kept, turned)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    seq=st.integers(1, 3),
    half=st.integers(1, 4),
    dtype=st.sampled_from([DType.F32, DType.F64, DType.F16]),
    spelling=st.builds(Spelling, st.booleans(), st.booleans(), st.booleans()),
    seed=st.integers(0, 2**16),
)
def test_rope_template_becomes_one_op_and_agrees(
    lead: list[int], seq: int, half: int, dtype: DType, spelling: Spelling, seed: int
) -> None:
    shape = (*lead, seq, 2 * half)
    rng = np.random.default_rng(seed)
    result = optimize_and_compare(
        lambda g: _rope_template(g, shape, dtype, spelling), rng, rtol=0.0, atol=0.0
    )
    for rule in _RULES if not spelling.rotated_first else ("rotate-half", "rope-rotated-first"):
        assert result.fired(rule) > 0, f"{rule} did not fire"
    assert result.count("Rope") == 1, result.after.op_histogram()
    assert result.count("NEG") == result.count("Concat") == 0


@pytest.mark.parametrize("rotated_first", [False, True])
@pytest.mark.parametrize("cos_first", [False, True])
def test_each_operand_order_has_its_rule(
    cos_first: bool, rotated_first: bool, rng: np.random.Generator
) -> None:
    spelling = Spelling(cos_first, rotated_first)
    result = optimize_and_compare(
        lambda g: _rope_template(g, (2, 4, 3, 8), F32, spelling), rng, rtol=0.0, atol=0.0
    )
    expected = (
        "cos-times-rotating" if cos_first else "rotating-times-cos",
        "sin-times-rotated" if cos_first else "rotated-times-sin",
        "rope-rotated-first" if rotated_first else "rope",
    )
    for rule in expected:
        assert result.fired(rule) > 0, f"{rule} did not fire"
    assert result.count("Rope") == 1


def _not_a_rope(g: GraphBuilder, what: str) -> Value:
    shape = (2, 4, 8)
    x = g.input("x", shape, F32)
    cos = g.broadcast(g.input("cos", shape[-2:], F32), shape)
    sin = g.broadcast(g.input("sin", shape[-2:], F32), shape)
    if what == "lower-half-negated":
        rotated = _rotate_half(g, x, negate_upper=False)
    elif what == "another-tensor-rotated":
        rotated = _rotate_half(g, g.input("y", shape, F32))
    elif what == "not-the-last-axis":
        rotated = _rotate_half(g, x, axis=1)
    else:
        rotated = _rotate_half(g, x)
    kept = g.input("y", shape, F32) if what == "another-tensor-kept" else x
    return g.add(g.mul(kept, cos), g.mul(rotated, sin))


@pytest.mark.parametrize(
    "what",
    ["lower-half-negated", "another-tensor-kept", "another-tensor-rotated", "not-the-last-axis"],
)
def test_what_only_looks_like_a_rope_stays_apart(what: str, rng: np.random.Generator) -> None:
    result = optimize_and_compare(lambda g: _not_a_rope(g, what), rng)
    assert result.count("Rope") == 0
    assert result.fired("rope") == result.fired("rope-rotated-first") == 0


def test_integer_template_stays_apart(rng: np.random.Generator) -> None:
    # Rope takes floats: an integer rotation keeps its ops (and stays exact).
    def build(g: GraphBuilder) -> Value:
        shape = (3, 4)
        x = g.input("x", shape, DType.I32)
        cos, sin = g.input("c", shape, DType.I32), g.input("s", shape, DType.I32)
        return g.add(g.mul(x, cos), g.mul(_rotate_half(g, x), sin))

    result = optimize_and_compare(build, rng)
    assert result.fired("rotate-half") == 0
    assert result.count("Rope") == 0


# ---- the tables' angles ------------------------------------------------------------------------


def _doubled_angles(
    g: GraphBuilder, *, positions_first: bool = True, column: bool = True, same: bool = True
) -> Value:
    """cos and sin of concat(m, m), m = positions [1, s, 1] * inverse frequencies [h].

    As decoders compute their rotary tables; `column=False` gives positions a full last axis
    (no broadcast along the concat axis), `same=False` concatenates two different products.
    """
    batch, seq, half = 2, 3, 4
    shape = (1, seq, 1) if column else (1, seq, half)  # full row: broadcast over batch only
    positions = g.cast(g.input("positions", shape, DType.I64), F32)
    p = g.broadcast(positions, (batch, seq, half))
    frequencies = np.linspace(0.1, 1.0, half).astype(np.float32)
    f = g.broadcast(g.view(g.constant(frequencies), (1, 1, half)), (batch, seq, half))
    m = g.mul(p, f) if positions_first else g.mul(f, p)
    other = m if same else g.mul(m, g.scalar(2.0, F32, (batch, seq, half)))
    angles = g.concat([m, other], axis=2)
    return g.add(g.unary(Unary.COS, angles), g.unary(Unary.SIN, angles))


@pytest.mark.parametrize("positions_first", [True, False])
def test_doubled_angles_concat_the_constants_instead(
    positions_first: bool, rng: np.random.Generator
) -> None:
    result = optimize_and_compare(
        lambda g: _doubled_angles(g, positions_first=positions_first),
        rng,
        low=0.0,
        high=50.0,
        rtol=0.0,
        atol=0.0,
    )
    rule = "doubled-product-broadcast-" + ("first" if positions_first else "second")
    assert result.fired(rule) > 0
    assert result.fired("doubled-broadcast") > 0
    assert result.count("Concat") == 0, result.after.op_histogram()


@pytest.mark.parametrize("what", ["full-row", "two-products"])
def test_angles_not_doubled_keep_their_concat(what: str, rng: np.random.Generator) -> None:
    column, same = what != "full-row", what != "two-products"
    result = optimize_and_compare(
        lambda g: _doubled_angles(g, column=column, same=same), rng, low=0.0, high=50.0
    )
    assert result.fired("doubled-product-broadcast-first") == 0
    assert result.count("Concat") >= 1


# ---- the decoder fixtures ----------------------------------------------------------------------

_LAYERS = 2  # tests/fixtures/make_decoder.py: two layers, four heads of 8, two key/value heads
_SIZES = {"batch": 2, "seq": 3, "past": 4, "total": 7}  # total: the mask, past + seq


def _decoder_feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
    batch, seq, past = _SIZES["batch"], _SIZES["seq"], _SIZES["past"]
    feeds = {
        "input_ids": rng.integers(0, 64, (batch, seq)).astype(np.int64),
        "attention_mask": np.ones((batch, past + seq), np.int64),
        "position_ids": np.arange(past, past + seq)[None].repeat(batch, 0).astype(np.int64),
    }
    for layer in range(_LAYERS):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{layer}.{kind}"] = random_array(
                rng, (batch, 2, past, 8), F32, low=-1.0, high=1.0
            )
    return feeds


def _kernels(program: Program) -> list[str]:
    return [k.kind for k in program.kernels if k.kind != "view"]


@pytest.mark.parametrize("name", ["llama_kv_ts17.onnx", "llama_kv_dynamo18.onnx"])
def test_decoder_ropes_are_one_kernel_each_and_agree_with_onnxruntime(
    name: str, rng: np.random.Generator
) -> None:
    path = DECODERS / name
    graph = knopt.load(path)
    result = knopt.optimize(graph, profile="h200", ilp=False)
    kernels = _kernels(result.program)
    # Per layer: q and k each in one Rope kernel, no negation or rotate_half concat left.
    assert kernels.count("Rope") == 2 * _LAYERS
    assert "NEG" not in kernels
    rotations = [
        k for k in result.program.kernels if isinstance(k.op, ops.Concat) and k.op.axis == 3
    ]
    assert not rotations
    print(f"{name}: {len(kernels)} kernels (each rope saves a negation and a concat)")
    feeds = _decoder_feeds(rng)
    ours = run_graph(bind_symbols(result.graph, _SIZES), feeds)
    theirs = run_onnxruntime(onnx.load(str(path)), feeds)
    assert_same(ours, theirs, rtol=1e-4, atol=1e-5)
