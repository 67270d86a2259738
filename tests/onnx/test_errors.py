"""Bad models and bad inputs give typed knopt errors that name the culprit, and write nothing."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import knopt
from knopt.errors import (
    InputError,
    InvalidGraphError,
    InvalidModelError,
    KnoptError,
    MemoryLimitError,
    UnsupportedModelError,
)
from knopt.ir import DType, GraphBuilder, sym
from tests.models import fixtures

F = TensorProto.FLOAT
MLP = next(f for f in fixtures() if f.file == "mlp_ts14.onnx")


def _info(name: str, shape: list[int | str] | None, dtype: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto] | None = None,
    opset: int = 18,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "bad", inputs, outputs, initializer=initializers or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*")}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A scratch folder that is also the working directory; the test fails if it changes."""
    monkeypatch.chdir(tmp_path)
    yield tmp_path


def _load_fails(
    workdir: Path, model: onnx.ModelProto | bytes, error: type[KnoptError], *fragments: str
) -> str:
    """Load `model` from a file in `workdir`; it must raise `error` and leave the folder as is."""
    path = workdir / "model.onnx"
    path.write_bytes(model if isinstance(model, bytes) else model.SerializeToString())
    before = _tree(workdir)
    with pytest.raises(error) as caught:
        knopt.load(path)
    assert _tree(workdir) == before
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message
    return message


# ---- unreadable files ----------------------------------------------------------------------


@pytest.mark.parametrize("fraction", [0.05, 0.5, 0.95])
def test_truncated_file_is_an_invalid_model(workdir: Path, fraction: float) -> None:
    data = MLP.path.read_bytes()
    _load_fails(workdir, data[: int(len(data) * fraction)], InvalidModelError, "model.onnx")


@pytest.mark.parametrize("content", [b"", b"hello, this is text", bytes(range(256)) * 4])
def test_file_that_is_not_onnx_is_an_invalid_model(workdir: Path, content: bytes) -> None:
    _load_fails(workdir, content, InvalidModelError, "model.onnx", "ONNX model")


def test_missing_file_is_an_invalid_model(workdir: Path) -> None:
    with pytest.raises(InvalidModelError, match="no such file"):
        knopt.load(workdir / "absent.onnx")
    assert _tree(workdir) == {}


# ---- malformed graphs ----------------------------------------------------------------------


def test_cycle_names_its_nodes(workdir: Path) -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="start"),
        helper.make_node("Add", ["a", "c"], ["b"], name="first"),
        helper.make_node("Neg", ["b"], ["c"], name="second"),
    ]
    model = _model(nodes, [_info("x", [2])], [_info("c", [2])])
    _load_fails(
        workdir, model, InvalidGraphError, "node 'first'", "cycle", "'second'", "export it again"
    )


def test_unsorted_nodes_are_sorted(rng: np.random.Generator) -> None:
    nodes = [
        helper.make_node("Neg", ["a"], ["y"], name="late"),
        helper.make_node("Relu", ["x"], ["a"], name="early"),
    ]
    model = _model(nodes, [_info("x", [2])], [_info("y", [2])])
    x = rng.standard_normal(2).astype(np.float32)
    (y,) = knopt.compile(model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(y, -np.maximum(x, 0))


def test_dangling_input_names_the_node_and_the_value(workdir: Path) -> None:
    nodes = [helper.make_node("Add", ["x", "ghost"], ["y"], name="add")]
    model = _model(nodes, [_info("x", [2])], [_info("y", [2])])
    _load_fails(
        workdir, model, InvalidGraphError, "node 'add'", "'ghost'", "dangling", "declare it"
    )


def test_undefined_graph_output_is_named(workdir: Path) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    model = _model(nodes, [_info("x", [2])], [_info("nowhere", [2])])
    _load_fails(workdir, model, InvalidGraphError, "graph output 'nowhere'")


def test_shapes_that_cannot_broadcast_name_the_node(workdir: Path) -> None:
    nodes = [helper.make_node("Add", ["x", "z"], ["y"], name="/block/add")]
    model = _model(nodes, [_info("x", [2, 3]), _info("z", [4])], [_info("y", None)])
    _load_fails(
        workdir,
        model,
        InvalidGraphError,
        "node '/block/add'",
        "[2, 3]",
        "cannot broadcast",
        "check the input shapes",
    )


# ---- unsupported content -------------------------------------------------------------------


def test_unsupported_op_names_the_node_and_points_to_info(workdir: Path) -> None:
    nodes = [helper.make_node("NoSuchOp", ["x"], ["y"], name="strange")]
    model = _model(nodes, [_info("x", [2])], [_info("y", [2])])
    _load_fails(workdir, model, UnsupportedModelError, "node 'strange'", "NoSuchOp", "knopt info")


def test_unsupported_attribute_value_lists_the_supported_ones(workdir: Path) -> None:
    pads = numpy_helper.from_array(np.array([0, 1, 0, 1], np.int64), "pads")
    nodes = [helper.make_node("Pad", ["x", "pads"], ["y"], name="pad", mode="spiral")]
    model = _model(nodes, [_info("x", [2, 3])], [_info("y", None)], [pads])
    _load_fails(workdir, model, UnsupportedModelError, "node 'pad'", "'spiral'", "reflect")


def test_attribute_knopt_does_not_read_is_refused(workdir: Path) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu", alpha=0.5)]
    model = _model(nodes, [_info("x", [2])], [_info("y", [2])])
    _load_fails(workdir, model, UnsupportedModelError, "node 'relu'", "alpha", "remove it")


def test_unsupported_element_type_names_the_input(workdir: Path) -> None:
    nodes = [helper.make_node("Identity", ["x"], ["y"], name="copy")]
    model = _model(
        nodes, [_info("x", [2], TensorProto.STRING)], [_info("y", [2], TensorProto.STRING)]
    )
    _load_fails(workdir, model, UnsupportedModelError, "graph input 'x'", "STRING", "supported")


# ---- sizes beyond the limit ----------------------------------------------------------------


def test_input_declaring_more_than_the_memory_limit_is_refused(workdir: Path) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    model = _model(nodes, [_info("x", [2**20, 2**20])], [_info("y", None)])
    _load_fails(
        workdir, model, MemoryLimitError, "graph input 'x'", "4.0 TiB", "KNOPT_MEMORY_LIMIT"
    )


def test_initializer_declaring_more_than_the_memory_limit_is_refused(workdir: Path) -> None:
    huge = TensorProto(name="w", data_type=F, dims=[2**20, 2**20])  # no data: never allocated
    nodes = [helper.make_node("Add", ["x", "w"], ["y"], name="add")]
    model = _model(nodes, [_info("x", [1])], [_info("y", None)], [huge])
    _load_fails(
        workdir, model, MemoryLimitError, "initializer 'w'", "4.0 TiB", "KNOPT_MEMORY_LIMIT"
    )


def test_initializer_whose_data_does_not_fit_its_shape_is_refused(workdir: Path) -> None:
    short = TensorProto(name="w", data_type=F, dims=[3], raw_data=b"\0\0\0\0")
    nodes = [helper.make_node("Add", ["x", "w"], ["y"], name="add")]
    model = _model(nodes, [_info("x", [3])], [_info("y", None)], [short])
    _load_fails(workdir, model, InvalidModelError, "initializer 'w'")


# ---- external data -------------------------------------------------------------------------


def _external_model(
    folder: Path, location: str, *, write_data: bool = True
) -> tuple[Path, np.ndarray]:
    """A model whose weight `w` lives in the external file `location`, relative to `folder`."""
    weight = np.arange(1, 33, dtype=np.float32).reshape(4, 8)
    if write_data:
        target = folder / location
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(weight.tobytes())
    tensor = TensorProto(name="w", data_type=F, dims=[4, 8])
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "128")):
        tensor.external_data.append(onnx.StringStringEntryProto(key=key, value=value))
    nodes = [helper.make_node("Add", ["x", "w"], ["y"], name="add")]
    model = _model(nodes, [_info("x", [4, 8])], [_info("y", [4, 8])], [tensor])
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path, weight


def test_external_data_inside_the_model_folder_loads(workdir: Path) -> None:
    path, weight = _external_model(workdir, "data/weights.bin")
    before = _tree(workdir)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    (y,) = knopt.compile(path).run(None, {"x": x})
    np.testing.assert_allclose(y, x + weight)
    assert _tree(workdir) == before


@pytest.mark.parametrize("escape", ["../outside.bin", "data/../../outside.bin", "absolute"])
def test_external_data_outside_the_model_folder_is_refused(workdir: Path, escape: str) -> None:
    folder = workdir / "model"
    folder.mkdir()
    location = str(workdir / "outside.bin") if escape == "absolute" else escape
    path, _ = _external_model(folder, location)
    before = _tree(workdir)
    with pytest.raises(InvalidModelError, match="outside the model's folder") as caught:
        knopt.load(path)
    assert "tensor 'w'" in str(caught.value)
    assert _tree(workdir) == before


def test_external_data_through_a_symlink_out_of_the_folder_is_refused(workdir: Path) -> None:
    folder = workdir / "model"
    folder.mkdir()
    _external_model(workdir, "outside.bin")
    os.symlink(workdir / "outside.bin", folder / "weights.bin")
    path, _ = _external_model(folder, "weights.bin", write_data=False)
    with pytest.raises(InvalidModelError, match="outside the model's folder"):
        knopt.load(path)


def test_external_data_from_bytes_asks_for_the_path(workdir: Path) -> None:
    path, _ = _external_model(workdir, "weights.bin")
    with pytest.raises(InvalidModelError, match="from its file path"):
        knopt.load(path.read_bytes())


def test_missing_external_data_file_is_named(workdir: Path) -> None:
    path, _ = _external_model(workdir, "weights.bin")
    (workdir / "weights.bin").unlink()
    with pytest.raises(InvalidModelError, match=r"'weights\.bin'"):
        knopt.load(path)


# ---- session inputs ------------------------------------------------------------------------


@pytest.fixture
def session() -> knopt.Session:
    return knopt.compile(MLP.path)


def test_missing_input_is_named(session: knopt.Session) -> None:
    with pytest.raises(InputError, match=r"missing input\(s\) \['input'\]"):
        session.run(None, {})


def test_unknown_input_is_named(session: knopt.Session) -> None:
    feeds = {**MLP.feeds(), "extra": np.ones(2, np.float32)}
    with pytest.raises(InputError, match=r"unknown input\(s\) \['extra'\]"):
        session.run(None, feeds)


def test_unknown_output_is_named(session: knopt.Session) -> None:
    with pytest.raises(InputError, match=r"unknown output\(s\) \['probs'\]"):
        session.run(["probs"], MLP.feeds())


@pytest.mark.parametrize("shape", [(2, 15), (2, 16, 1), (16,)])
def test_wrong_shape_is_named_with_the_expected_one(
    session: knopt.Session, shape: tuple[int, ...]
) -> None:
    feeds = {"input": np.ones(shape, np.float32)}
    with pytest.raises(InputError, match=r"input 'input' has shape .* expected \[batch, 16\]"):
        session.run(None, feeds)


def test_wrong_dtype_is_named_with_the_expected_one(session: knopt.Session) -> None:
    feeds = {"input": np.ones((2, 16), np.float64)}
    with pytest.raises(InputError, match="input 'input' has dtype float64, expected float32"):
        session.run(None, feeds)


def test_conflicting_symbolic_sizes_are_named() -> None:
    b = GraphBuilder("two")
    n = sym("n")
    x = b.input("x", (n, 2), DType.F32)
    y = b.input("y", (n, 2), DType.F32)
    b.output(b.add(x, y), "z")
    session = knopt.compile(b.build())
    feeds = {"x": np.ones((2, 2), np.float32), "y": np.ones((3, 2), np.float32)}
    with pytest.raises(InputError, match="size 'n' is 3 here but 2"):
        session.run(None, feeds)


def test_long_reversed_chain_is_sorted_and_a_long_cycle_named_without_recursion(
    workdir: Path,
) -> None:
    names = ["x", *(f"v{i}" for i in range(3000))]
    chain = [
        helper.make_node("Neg", [a], [b], name=f"neg{i}")
        for i, (a, b) in enumerate(itertools.pairwise(names))
    ]
    model = _model(chain[::-1], [_info("x", [2])], [_info(names[-1], [2])])
    x = np.array([1.5, -2.0], np.float32)
    (y,) = knopt.compile(model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(y, x)  # 3000 negations
    chain[0].input[0] = names[-1]  # the first reads the last: one cycle through all of them
    model = _model(chain[::-1], [_info("x", [2])], [_info(names[-1], [2])])
    _load_fails(workdir, model, InvalidGraphError, "cycle of nodes", "'neg2999' -> 'neg0'")


@pytest.mark.parametrize(
    "count", [0, 3, 2**31]
)  # found by the mutation fuzzer: 0 divided, 2^31 hung
def test_split_num_outputs_other_than_its_outputs_is_an_error(workdir: Path, count: int) -> None:
    node = helper.make_node("Split", ["x"], ["a", "b"], axis=0, num_outputs=count, name="split")
    model = _model([node], [_info("x", [4])], [_info("a", [2]), _info("b", [2])])
    _load_fails(workdir, model, KnoptError, "split", f"num_outputs is {count}", "2 outputs")
