"""Sessions: one optimized program for every size, profiles of sizes, resident caches, and
models that import only with fixed sizes (imported once per input shape)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import knopt
from knopt.errors import InputError, KnoptError, SymbolicSizeError, UsageError
from knopt.ir.graph import Graph
from knopt.session import PRECISIONS, PerSizeSession
from tests.models import MODELS, fixtures
from tests.oracle import run_onnxruntime


def _same_padded_conv() -> onnx.ModelProto:
    # auto_pad SAME pads by an amount that depends on the (symbolic) image size.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Conv", ["x", "k"], ["conv"], auto_pad="SAME_UPPER", strides=[2, 2]),
        helper.make_node("ReduceMean", ["conv"], ["pooled"], axes=[2, 3], keepdims=0),
        helper.make_node("Add", ["pooled", "y"], ["out"]),
    ]
    kernel = np.linspace(-1, 1, 2 * 2 * 3 * 3, dtype=np.float32).reshape(2, 2, 3, 3)
    graph = helper.make_graph(nodes, "same", [x, y], [out], [numpy_helper.from_array(kernel, "k")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_model_that_needs_fixed_sizes_imports_per_input_shape(rng: np.random.Generator) -> None:
    model = _same_padded_conv()
    data = model.SerializeToString()
    with pytest.raises(SymbolicSizeError, match=r"dims="):
        knopt.load(data)
    session = knopt.compile(data)
    assert isinstance(session, PerSizeSession)
    assert session.input_names == ["x", "y"]
    assert session.output_names == ["out"]
    for n, h, w in ((1, 7, 6), (2, 5, 9), (1, 7, 6)):
        feeds = {
            "x": rng.uniform(-2, 2, (n, 2, h, w)).astype(np.float32),
            "y": rng.uniform(-2, 2, (n, 2)).astype(np.float32),
        }
        (ours,) = session.run(None, feeds)
        np.testing.assert_allclose(ours, run_onnxruntime(model, feeds)[0], rtol=1e-6, atol=1e-7)
    assert session.graph.symbols() == frozenset()
    (optimized,) = knopt.compile(data, optimize=True).run(None, feeds)
    np.testing.assert_allclose(optimized, ours, rtol=1e-6, atol=1e-7)


def test_per_size_session_rejects_inputs_of_the_wrong_rank() -> None:
    session = knopt.compile(_same_padded_conv().SerializeToString())
    with pytest.raises(InputError, match="input 'y'"):
        session.run(None, {"x": np.ones((1, 2, 4, 4), np.float32), "y": np.ones(2, np.float32)})


def test_names_found_right_once_are_still_checked_when_they_change() -> None:
    mlp = next(f for f in fixtures() if f.file == "mlp_ts14.onnx")
    session = knopt.compile(mlp.path)
    feeds = mlp.feeds()
    first = session.run(None, feeds)
    session.run(None, feeds)  # the names' check is remembered
    with pytest.raises(InputError, match=r"unknown input\(s\) \['extra'\]"):
        session.run(None, {**feeds, "extra": np.ones(2, np.float32)})
    with pytest.raises(InputError, match=r"missing input\(s\)"):
        session.run(None, {})
    with pytest.raises(InputError, match=r"unknown output\(s\) \['probs'\]"):
        session.run(["probs"], feeds)
    (name,) = session.output_names
    twice = session.run((name, name), feeds)
    np.testing.assert_array_equal(twice[1], first[0])


# ---- one optimized program for every size --------------------------------------------------

BERT = MODELS / "bert_ts14.onnx"
DECODERS = MODELS.parent / "decoder"
CACHES = {
    f"present.{i}.{kv}": f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")
}


def _bert_feeds(rng: np.random.Generator, batch: int, seq: int) -> dict[str, np.ndarray]:
    mask = np.ones((batch, seq), np.int64)
    mask[:, seq // 2 + 1 :] = rng.integers(0, 2, (batch, seq - seq // 2 - 1))
    return {
        "input_ids": rng.integers(0, 100, (batch, seq)).astype(np.int64),
        "attention_mask": mask,
    }


def test_one_session_over_many_sizes_equals_a_session_per_size(rng: np.random.Generator) -> None:
    session = knopt.compile(BERT, optimize=True, dims={"batch": (1, 2, 8), "seq": (1, 12, 16)})
    pairs = [(2, 12), (1, 1), (5, 16), (3, 7), (1, 13), (8, 2), (2, 12), (4, 9)]
    rng.shuffle(pairs)
    for batch, seq in pairs:
        feeds = _bert_feeds(rng, batch, seq)
        (ours,) = session.run(None, feeds)
        # The fresh session imports the model at these sizes and runs the reference executor.
        fresh = knopt.compile(knopt.load(BERT, {"batch": batch, "seq": seq}))
        (theirs,) = fresh.run(None, feeds)
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    assert session.stats.optimizer_runs == 1
    assert session.stats.bindings == len(set(pairs))


def test_sizes_outside_the_profile_are_refused() -> None:
    session = knopt.compile(BERT, dims={"batch": (1, 2, 4), "seq": 12})
    ids = np.ones((2, 12), np.int64)
    session.run(None, {"input_ids": ids, "attention_mask": ids})
    with pytest.raises(InputError, match=r"size 'batch' is 5, outside .* 1\.\.4"):
        five = np.ones((5, 12), np.int64)
        session.run(None, {"input_ids": five, "attention_mask": five})
    with pytest.raises(InputError, match=r"input 'input_ids' has shape \[2, 9\]"):
        session.run(None, {"input_ids": ids[:, :9], "attention_mask": ids[:, :9]})


@pytest.mark.parametrize(
    ("dims", "message"),
    [
        ({"sequence": (1, 8, 16)}, r"no size 'sequence' \(its sizes: batch, seq\)"),
        ({"seq": (8, 4, 16)}, r"0 <= min <= opt <= max"),
        ({"seq": (1, 8)}, r"neither a size nor a \(min, opt, max\) range"),
    ],
)
def test_a_bad_profile_is_an_error(dims: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        knopt.compile(BERT, dims=dims)


def test_the_optimizer_runs_once_and_costs_at_the_profiles_opt(monkeypatch) -> None:
    calls: list[dict[str, int]] = []
    original = knopt.session.optimize_graph

    def counting(graph: Graph, **options: object) -> object:
        sizes = options["sizes"]
        assert isinstance(sizes, dict)
        calls.append(dict(sizes))
        return original(graph, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(knopt.session, "optimize_graph", counting)
    session = knopt.compile(BERT, optimize=True, dims={"batch": (1, 4, 8), "seq": (1, 16, 16)})
    for batch, seq in ((1, 3), (2, 5), (7, 16)):
        ids = np.ones((batch, seq), np.int64)
        session.run(None, {"input_ids": ids, "attention_mask": ids})
    assert calls == [{"batch": 4, "seq": 16}]


def _decode(session: knopt.Session, ids: np.ndarray, prompt: int) -> np.ndarray:
    batch, total = ids.shape
    positions = np.arange(total)[None].repeat(batch, 0)
    logits = [
        session.run(
            ["logits"],
            {
                "input_ids": ids[:, :prompt],
                "attention_mask": np.ones((batch, prompt), np.int64),
                "position_ids": positions[:, :prompt],
            },
        )[0]
    ]
    for i in range(prompt, total):
        step = {
            "input_ids": ids[:, i : i + 1],
            "attention_mask": np.ones((batch, i + 1), np.int64),
            "position_ids": positions[:, i : i + 1],
        }
        logits.append(session.run(["logits"], step)[0])
    return np.concatenate(logits, axis=1)


@pytest.mark.parametrize("name", ["llama_kv_ts17.onnx", "llama_kv_dynamo18.onnx"])
@pytest.mark.parametrize("static", [False, True])
def test_decoding_step_by_step_equals_the_whole_sequence(
    name: str, static: bool, rng: np.random.Generator
) -> None:
    path = DECODERS / name
    batch, prompt, steps = 2, 5, 20
    ids = rng.integers(0, 64, (batch, prompt + steps)).astype(np.int64)
    whole = knopt.compile(path)
    feeds = {
        "input_ids": ids,
        "attention_mask": np.ones(ids.shape, np.int64),
        "position_ids": np.arange(ids.shape[1])[None].repeat(batch, 0),
        **{n: np.zeros((batch, 2, 0, 8), np.float32) for n in CACHES.values()},
    }
    (expected,) = whole.run(["logits"], feeds)
    session = knopt.compile(
        path,
        optimize=True,
        dims={"batch": (1, 2, 4), "seq": (1, 8, 32), "past": (0, 16, 64)},
        resident=CACHES,
        cache_mask="attention_mask" if static else None,
    )
    np.testing.assert_allclose(_decode(session, ids, prompt), expected, rtol=1e-5, atol=1e-5)
    assert session.stats.optimizer_runs == 1
    # A static cache plans the prefill and one bucket; otherwise each length has its plan.
    assert session.stats.bindings == (2 if static else 1 + steps)
    (present,) = session.run(
        ["present.0.key"],
        {
            "input_ids": ids[:, :1],
            "attention_mask": np.ones((batch, prompt + steps + 1), np.int64),
            "position_ids": np.full((batch, 1), prompt + steps),
        },
    )
    assert present.shape == (batch, 2, prompt + steps + 1, 8)


def test_reset_starts_from_an_empty_cache(rng: np.random.Generator) -> None:
    session = knopt.compile(
        DECODERS / "llama_kv_ts17.onnx",
        dims={"past": (0, 8, 64), "seq": (1, 1, 8)},
        resident=CACHES,
        cache_mask="attention_mask",
    )
    ids = rng.integers(0, 64, (1, 6)).astype(np.int64)
    feeds = {
        "input_ids": ids,
        "attention_mask": np.ones((1, 6), np.int64),
        "position_ids": np.arange(6)[None],
    }
    (first,) = session.run(["logits"], feeds)
    with pytest.raises(InputError, match="must cover 12"):
        session.run(["logits"], feeds)
    session.reset()
    (again,) = session.run(["logits"], feeds)
    np.testing.assert_array_equal(first, again)


def test_resident_pairs_must_be_caches() -> None:
    path = DECODERS / "llama_kv_ts17.onnx"
    with pytest.raises(KnoptError, match=r"'logits' <- 'past_key_values\.0\.key': types differ"):
        knopt.compile(path, resident={"logits": "past_key_values.0.key"})
    with pytest.raises(KnoptError, match="give ranges for \\['past', 'seq'\\]"):
        knopt.compile(path, resident=CACHES, cache_mask="attention_mask")


# ---- what a session is asked for ------------------------------------------------------------


def _tiny_graph() -> Graph:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return knopt.load(model.SerializeToString())


@pytest.mark.parametrize("device", ["cpu", "best"])
def test_an_unknown_precision_or_device_is_refused(device: str) -> None:
    with pytest.raises(UsageError, match=r"precision 'banana' is unknown \(use f32, tf32"):
        knopt.compile(_tiny_graph(), device, precision="banana")
    with pytest.raises(UsageError, match=r"device 'gpu' is unknown \(use cpu, cuda, best\)"):
        knopt.compile(_tiny_graph(), "gpu")


def test_precisions_are_those_of_the_cuda_backend() -> None:
    from knopt.cuda.precision import PRECISIONS as CUDA_PRECISIONS

    assert tuple(CUDA_PRECISIONS) == PRECISIONS


@pytest.mark.parametrize("precision", ["tf32", "fp16", "bf16"])
def test_a_narrow_precision_on_the_cpu_is_refused(precision: str) -> None:
    with pytest.raises(UsageError, match=f"precision '{precision}' is for device 'cuda'"):
        knopt.compile(_tiny_graph(), "cpu", precision=precision)


def test_best_without_a_gpu_warns_that_it_runs_in_f32() -> None:
    import knopt.cuda

    if knopt.cuda.is_available():
        pytest.skip("a GPU is usable here, so 'best' runs on it in fp16")
    with pytest.warns(UserWarning, match="running on the CPU in f32, not fp16"):
        session = knopt.compile(_tiny_graph(), "best", precision="fp16")
    assert session.device == "cpu"
    (y,) = session.run(None, {"x": np.array([-1.0, 2.0], np.float32)})
    np.testing.assert_array_equal(y, [0.0, 2.0])
