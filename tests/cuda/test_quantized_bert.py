"""The launches of a quantized BERT planned in fp16 (no GPU), layer by layer, against the float
model's: the structure behind benchmarks/quantized_bert.py (issue #14).

A 2-layer BERT fixture, its linear layers quantized as the benchmark quantizes BERT-base
(int8 QDQ, per-channel weights, float attention), is optimized and planned in fp16 beside the
float model. Attention must be cuDNN's (`Sdpa`) in both. Each int32 sum a GEMM writes must be
read once, by one kernel that writes what follows it; a layer may launch at most
`INT8_LAYER_STEPS` steps (the float model's `FLOAT_LAYER_STEPS`). Run as a script, it prints
both plans a step a line with the bytes each step reads and writes:

    python -m tests.cuda.test_quantized_bert
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np

import knopt
from knopt.cuda.context import PlanTensor
from knopt.cuda.planner import Plan, build_plan
from knopt.cuda.precision import effective_precision, narrow_dtype, narrow_program
from knopt.cuda.steps import Buf, Gemm, Launch, Sdpa, Step, describe_step, step_tensors
from knopt.ir import bind_symbols
from knopt.ir.dtype import DType
from tests.cuda.quant import quantize_linear_layers

BERT = Path(__file__).parents[1] / "fixtures" / "models" / "bert_ts14.onnx"
SIZES = {"batch": 4, "seq": 64}  # past DECODE_ROWS query rows: prefill, cuDNN's attention
LAYERS = 2
# Per layer: the QKV GEMM and its epilogue, attention, the quantize after it, then three
# GEMMs with their epilogues and two LayerNorms. The float model: four GEMMs, attention,
# two LayerNorms and the GELU.
INT8_LAYER_STEPS = 12
FLOAT_LAYER_STEPS = 8


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    shape = (SIZES["batch"], SIZES["seq"])
    mask = np.ones(shape, np.int64)
    mask[:, 50:] = 0
    return {"input_ids": rng.integers(0, 100, shape).astype(np.int64), "attention_mask": mask}


@functools.cache
def _plans() -> dict[str, Plan]:
    """The float and the quantized model's fp16 plans."""
    with tempfile.TemporaryDirectory() as folder:
        quantized = Path(folder) / "bert_int8.onnx"
        quantize_linear_layers(BERT, quantized, _feeds())
        return {"float": _plan(BERT), "int8": _plan(quantized)}


def _plan(path: Path) -> Plan:
    graph = bind_symbols(knopt.load(path), SIZES)
    program = knopt.optimize(graph, profile="h200", ilp=False).program
    precision = effective_precision(program, "fp16")
    target = narrow_dtype(precision)
    return build_plan(narrow_program(program, target) if target is not None else program)


def _bytes(tensor: PlanTensor) -> int:
    """The bytes a step touches reading or writing `tensor` (broadcast axes once)."""
    size = tensor.dtype.itemsize
    for n, stride in zip(tensor.layout.shape, tensor.layout.strides, strict=True):
        size *= n if stride else 1
    return size


def _written(step: Step) -> list[int]:
    if isinstance(step, Launch):  # knopt's kernels take their output first
        return [arg.tensor for arg in step.args[:1] if isinstance(arg, Buf)]
    if isinstance(step, Sdpa):
        return [step.out]
    assert isinstance(step, Gemm), describe_step(step)
    return [step.d.tensor]


def _read(step: Step) -> list[int]:
    if isinstance(step, Sdpa):
        return [t for t in (step.q, step.k, step.v, step.bias) if t is not None]
    written = _written(step)
    return [t for t in step_tensors(step) if t not in written]


def layer_steps(plan: Plan) -> list[Step]:
    """The steps from the first layer's attention up to the second's: one whole layer."""
    at = [i for i, step in enumerate(plan.steps) if isinstance(step, Sdpa)]
    return plan.steps[at[0] : at[1]]


def describe(plan: Plan) -> list[str]:
    """A line a step: what it is, and the MiB it reads and writes."""
    lines = []
    for step in plan.steps:
        name = step.name if isinstance(step, Launch) else describe_step(step)
        read = sum(_bytes(plan.tensors[t]) for t in _read(step)) / 2**20
        wrote = sum(_bytes(plan.tensors[t]) for t in _written(step)) / 2**20
        lines.append(f"{name[:56]:56} read {read:8.3f} MiB  write {wrote:8.3f} MiB")
    return lines


def test_attention_is_cudnns_in_both_programs() -> None:
    for name, plan in _plans().items():
        attentions = [s for s in plan.steps if isinstance(s, Sdpa)]
        assert len(attentions) == LAYERS, name
        assert all(s.dtype is DType.F16 and s.bias is not None for s in attentions), name
        launches = [s.name for s in plan.steps if isinstance(s, Launch)]
        assert not any(n.startswith("kn_attention") for n in launches), (name, launches)


def test_a_layer_launches_at_most_its_share() -> None:
    plans = _plans()
    assert len(layer_steps(plans["float"])) <= FLOAT_LAYER_STEPS, describe(plans["float"])
    assert len(layer_steps(plans["int8"])) <= INT8_LAYER_STEPS, describe(plans["int8"])


def test_every_int32_sum_is_read_once_into_what_follows_it() -> None:
    plan = _plans()["int8"]
    sums = [s.d.tensor for s in plan.steps if isinstance(s, Gemm) and s.dtype is DType.I8]
    assert len(sums) == 4 * LAYERS
    for tid in sums:
        assert plan.tensors[tid].dtype is DType.I32
        buffer = plan.tensors[tid].buffer
        readers = [s for s in plan.steps if buffer in {plan.tensors[t].buffer for t in _read(s)}]
        assert len(readers) == 1, [describe_step(s) for s in readers]
        (reader,) = readers
        assert all(plan.tensors[t].dtype is not DType.I32 for t in _written(reader))


if __name__ == "__main__":
    for name, found in _plans().items():
        print(f"{name}: {len(found.steps)} steps, {len(layer_steps(found))} a layer")
        print("\n".join(describe(found)))
