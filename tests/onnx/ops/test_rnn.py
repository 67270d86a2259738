"""RNN, GRU and LSTM import: unrolled recurrences agree with onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import knopt
from knopt.errors import SymbolicSizeError
from tests.onnx.ops.node_models import assert_matches, node_model
from tests.oracle import run_onnxruntime

SEQ, BATCH, INPUT, HIDDEN = 4, 2, 3, 5


def _weights(
    rng: np.random.Generator, gates: int, directions: int, bias: bool = True
) -> dict[str, np.ndarray]:
    weights = {
        "W": rng.uniform(-1, 1, (directions, gates * HIDDEN, INPUT)).astype(np.float32),
        "R": rng.uniform(-1, 1, (directions, gates * HIDDEN, HIDDEN)).astype(np.float32),
    }
    if bias:
        weights["B"] = rng.uniform(-1, 1, (directions, 2 * gates * HIDDEN)).astype(np.float32)
    return weights


@pytest.mark.parametrize(("op", "gates"), [("RNN", 1), ("GRU", 3), ("LSTM", 4)])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_recurrent_layers_match_onnxruntime(
    rng: np.random.Generator, op: str, gates: int, direction: str
) -> None:
    directions = 2 if direction == "bidirectional" else 1
    x = rng.uniform(-1, 1, (SEQ, BATCH, INPUT)).astype(np.float32)
    h0 = rng.uniform(-1, 1, (directions, BATCH, HIDDEN)).astype(np.float32)
    constants = {
        **_weights(rng, gates, directions),
        "sequence_lens": np.full(BATCH, SEQ, np.int32),
        "initial_h": h0,
    }
    outputs = ["Y", "Y_h"] if op != "LSTM" else ["Y", "Y_h", "Y_c"]
    model = node_model(
        op,
        {"X": x},
        outputs,
        opset=14,
        constants=constants,
        hidden_size=HIDDEN,
        direction=direction,
    )
    assert_matches(model, {"X": x}, rtol=1e-4, atol=1e-5)


def test_gru_with_linear_before_reset_matches_onnxruntime(rng: np.random.Generator) -> None:
    x = rng.uniform(-1, 1, (SEQ, BATCH, INPUT)).astype(np.float32)
    model = node_model(
        "GRU",
        {"X": x},
        ["Y", "Y_h"],
        opset=14,
        constants=_weights(rng, 3, 1),
        hidden_size=HIDDEN,
        linear_before_reset=1,
    )
    assert_matches(model, {"X": x}, rtol=1e-4, atol=1e-5)


def _lstm_constants(rng: np.random.Generator, batch_first: bool) -> dict[str, np.ndarray]:
    state = (BATCH, 1, HIDDEN) if batch_first else (1, BATCH, HIDDEN)
    return {
        **_weights(rng, 4, 1),
        "sequence_lens": np.full(BATCH, SEQ, np.int32),
        "initial_h": rng.uniform(-1, 1, state).astype(np.float32),
        "initial_c": rng.uniform(-1, 1, state).astype(np.float32),
        "P": rng.uniform(-1, 1, (1, 3 * HIDDEN)).astype(np.float32),
    }


def test_lstm_with_peepholes_and_clip_matches_onnxruntime(rng: np.random.Generator) -> None:
    x = rng.uniform(-1, 1, (SEQ, BATCH, INPUT)).astype(np.float32)
    model = node_model(
        "LSTM",
        {"X": x},
        ["Y", "Y_h", "Y_c"],
        opset=14,
        constants=_lstm_constants(rng, False),
        hidden_size=HIDDEN,
        clip=0.5,
    )
    assert_matches(model, {"X": x}, rtol=1e-4, atol=1e-5)


def test_batch_first_lstm_matches_the_reference(rng: np.random.Generator) -> None:
    x = rng.uniform(-1, 1, (BATCH, SEQ, INPUT)).astype(np.float32)
    model = node_model(
        "LSTM",
        {"X": x},
        ["Y", "Y_h", "Y_c"],
        opset=14,
        constants=_lstm_constants(rng, True),
        hidden_size=HIDDEN,
        layout=1,
    )
    # onnxruntime has no batch-first recurrent layers; the reference evaluator has.
    assert_matches(model, {"X": x}, oracle="reference", rtol=1e-4, atol=1e-5)


def test_rnn_with_custom_activation_matches_onnxruntime(rng: np.random.Generator) -> None:
    x = rng.uniform(-1, 1, (SEQ, BATCH, INPUT)).astype(np.float32)
    model = node_model(
        "RNN",
        {"X": x},
        ["Y"],
        opset=14,
        constants=_weights(rng, 1, 1, bias=False),
        hidden_size=HIDDEN,
        activations=["LeakyRelu"],
        activation_alpha=[0.2],
    )
    assert_matches(model, {"X": x}, rtol=1e-4, atol=1e-5)


def test_lstm_over_a_dynamic_sequence_imports_per_length(rng: np.random.Generator) -> None:
    # TorchScript exports nn.LSTM with a dynamic sequence axis; unrolling needs its length, so
    # loading asks for it and knopt.compile imports once per input length.
    weights = _weights(rng, 4, 2)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", INPUT])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
    node = helper.make_node(
        "LSTM",
        ["x", "W", "R", "B"],
        ["Y"],
        name="lstm",
        hidden_size=HIDDEN,
        direction="bidirectional",
    )
    initializers = [numpy_helper.from_array(a, n) for n, a in weights.items()]
    graph = helper.make_graph([node], "lstm", [x], [y], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    data = model.SerializeToString()
    with pytest.raises(SymbolicSizeError, match=r"node 'lstm'.*seq.*dims="):
        knopt.load(data)
    session = knopt.compile(data)
    for seq, batch in ((5, 1), (3, 2), (5, 1)):
        feeds = {"x": rng.uniform(-1, 1, (seq, batch, INPUT)).astype(np.float32)}
        (ours,) = session.run(None, feeds)
        np.testing.assert_allclose(ours, run_onnxruntime(model, feeds)[0], rtol=1e-5, atol=1e-6)
    (fixed,) = knopt.compile(knopt.load(data, {"seq": 5})).run(None, feeds)
    np.testing.assert_array_equal(fixed, ours)
