"""The quantized fixtures (tests/fixtures/quantized) import and run equal to onnxruntime.

onnxruntime runs each model as written (ORT_DISABLE_ALL): its fused QDQ kernels round
differently from the model's float arithmetic between Q and DQ nodes, and its default fusion of
int4 DequantizeLinear + MatMul quantizes activations to int8, neither of which the model says.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import knopt
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
