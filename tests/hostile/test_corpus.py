"""The fuzzer's own small models are sound: knopt and onnxruntime agree on each."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import knopt
from tests.hostile.corpus import corpus
from tests.oracle import run_onnxruntime

MODELS = dict(corpus())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_corpus_model_agrees_with_onnxruntime(name: str) -> None:
    proto = onnx.ModelProto()
    proto.ParseFromString(MODELS[name])
    rng = np.random.default_rng(4)
    feeds = {}
    for value in proto.graph.input:
        dims = value.type.tensor_type.shape.dim
        shape = [d.dim_value if d.HasField("dim_value") else 3 for d in dims]
        feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    expected = run_onnxruntime(proto, feeds)
    got = knopt.compile(MODELS[name]).run(None, feeds)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
