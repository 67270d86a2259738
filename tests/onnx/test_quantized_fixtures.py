"""The quantized fixtures (tests/fixtures/quantized) import and run equal to onnxruntime.

onnxruntime runs each model as written (ORT_DISABLE_ALL): its fused QDQ kernels round
differently from the model's float arithmetic between Q and DQ nodes, and its default fusion of
int4 DequantizeLinear + MatMul quantizes activations to int8, neither of which the model says.

Optimized (rules/quantize.egg), the products run as integer kernels with their requantization
fused; on these inputs that changes no code, so the outputs still equal onnxruntime's within
float rounding. The optimized programs have fewer kernels than onnxruntime's optimized graphs
have nodes (the manifest's counts). One fixture per model and quantization method is optimized
here (optimizing all 25 takes minutes); benchmarks/kernels.py counts them all.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import knopt
from knopt.ir.program import Program
from tests.models import Fixture

QUANTIZED = Path(__file__).parents[1] / "fixtures" / "quantized"
MANIFEST = json.loads((QUANTIZED / "manifest.json").read_text())
ENTRIES = MANIFEST["files"]


def _fixture(entry: dict) -> Fixture:
    return Fixture(entry["file"], entry["model"], entry["variant"], entry["inputs"])


def _onnxruntime_as_written(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["file"])
def test_quantized_fixture_matches_onnxruntime(entry: dict) -> None:
    path = QUANTIZED / entry["file"]
    feeds = _fixture(entry).feeds(seed=3)
    ours = knopt.compile(str(path)).run(None, feeds)
    theirs = _onnxruntime_as_written(path, feeds)
    for mine, expected in zip(ours, theirs, strict=True):
        assert mine.shape == expected.shape
        peak = float(np.abs(expected).max())
        np.testing.assert_allclose(mine, expected, rtol=1e-5, atol=1e-6 * peak)


# One fixture per quantization method, each model at least once, and the integer kernel its
# products become.
OPTIMIZED = {
    "resnet_qdq_u8.onnx": "int_conv",
    "resnet_dynamic.onnx": "int_conv",
    "bert_qdq_u8s8_channel.onnx": "int_matmul",
    "bert_dynamic.onnx": "int_matmul",
    "bert_nbits4.onnx": "int4_matmul",
    "llama_qdq_s8.onnx": "int_matmul",
    "llama_nbits4_sym.onnx": "int4_matmul",
    "llama_int4_dq_sym.onnx": "int4_matmul",
}


def _kernels(program: Program) -> list[str]:
    return [str(k.kind) for k in program.kernels if k.kind != "view"]


@pytest.mark.parametrize(
    "entry", [e for e in ENTRIES if e["file"] in OPTIMIZED], ids=lambda e: e["file"]
)
def test_optimized_quantized_fixture_runs_integer_kernels_equal_to_onnxruntime(
    entry: dict,
) -> None:
    path = QUANTIZED / entry["file"]
    result = knopt.optimize(knopt.load(path), profile="h200", ilp=False)
    kinds = _kernels(result.program)
    assert OPTIMIZED[entry["file"]] in kinds
    assert len(kinds) <= entry["onnxruntime_nodes"]
    feeds = _fixture(entry).feeds(seed=3)
    ours = knopt.compile(result.graph).run(None, feeds)
    theirs = _onnxruntime_as_written(path, feeds)
    for mine, expected in zip(ours, theirs, strict=True):
        peak = float(np.abs(expected).max())
        np.testing.assert_allclose(mine, expected, rtol=1e-5, atol=1e-6 * peak)


def test_manifest_covers_every_quantization_and_records_onnxruntime_node_counts() -> None:
    variants = {(e["model"], e["variant"]) for e in ENTRIES}
    for model in ("resnet", "bert", "llama"):
        for variant in ("qdq_u8", "qdq_s8", "qdq_u8s8_channel", "qdq_s8_channel", "dynamic"):
            assert (model, variant) in variants
    for model in ("bert", "llama"):
        for variant in ("nbits4", "nbits4_sym", "nbits8", "int4_dq", "int4_dq_sym"):
            assert (model, variant) in variants
    for entry in ENTRIES:
        path = QUANTIZED / entry["file"]
        assert path.stat().st_size < 1_000_000
        assert 0 < entry["onnxruntime_nodes"] <= entry["onnx_nodes"]
        assert len(onnx.load(path).graph.node) == entry["onnx_nodes"]


def test_weight_only_fixtures_keep_their_int4_weights() -> None:
    for entry in ENTRIES:
        model = onnx.load(QUANTIZED / entry["file"])
        if entry["variant"].startswith("nbits"):
            assert "com.microsoft.MatMulNBits" in entry["op_types"]
        if entry["variant"].startswith("int4_dq"):
            types = {t.data_type for t in model.graph.initializer}
            assert types & {onnx.TensorProto.INT4, onnx.TensorProto.UINT4}
