"""External data anywhere in a model is read from the model's folder only, through one loader.

Each placement below hides a tensor with external data somewhere else in a model; the model's
output is that tensor, so reading the wrong file would show in the result.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import knopt
from knopt.errors import InvalidModelError
from knopt.onnx import import_model
from tests.hostile.builders import LOCAL, external, function, info, model

U8 = TensorProto.UINT8
SECRET = b"top secret bytes"  # 16 bytes, read only if a check fails
GOOD = bytes(range(100, 116))
OUT = info("y", [16], U8)


def _constant(tensor: TensorProto) -> onnx.NodeProto:
    return helper.make_node("Constant", [], ["y"], value=tensor, name="const")


def _initializer(t: TensorProto) -> onnx.ModelProto:
    t.name = "w"
    return model([helper.make_node("Identity", ["w"], ["y"], name="copy")], [], [OUT], [t])


def _constant_node(t: TensorProto) -> onnx.ModelProto:
    return model([_constant(t)], [], [OUT])


def _branch(t: TensorProto) -> onnx.ModelProto:
    then = helper.make_graph([_constant(t)], "then", [], [OUT])
    zeros = helper.make_tensor("z", U8, [16], bytes(16), raw=True)
    other = helper.make_graph([_constant(zeros)], "else", [], [OUT])
    flag = helper.make_tensor("flag", TensorProto.BOOL, [], [True])
    nodes = [
        helper.make_node("Constant", [], ["c"], value=flag, name="flag"),
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if"),
    ]
    return model(nodes, [], [OUT])


def _branch_initializer(t: TensorProto) -> onnx.ModelProto:
    t.name = "w"
    then = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])], "then", [], [OUT], initializer=[t]
    )
    flag = helper.make_tensor("flag", TensorProto.BOOL, [], [True])
    nodes = [
        helper.make_node("Constant", [], ["c"], value=flag, name="flag"),
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=then, name="if"),
    ]
    return model(nodes, [], [OUT])


def _function_constant(t: TensorProto) -> onnx.ModelProto:
    leak = function("Leak", [], ["y"], [_constant(t)])
    call = helper.make_node("Leak", [], ["y"], domain=LOCAL, name="call")
    return model([call], [], [OUT], functions=[leak])


def _nested_function(t: TensorProto) -> onnx.ModelProto:
    leak = function("Leak", [], ["y"], [_constant(t)])
    outer = function("Outer", [], ["y"], [helper.make_node("Leak", [], ["y"], domain=LOCAL)])
    call = helper.make_node("Outer", [], ["y"], domain=LOCAL, name="call")
    return model([call], [], [OUT], functions=[outer, leak])


def _function_default(t: TensorProto) -> onnx.ModelProto:
    body = helper.make_node("Constant", [], ["y"])
    ref = helper.make_attribute_ref("value", onnx.AttributeProto.TENSOR)
    ref.ref_attr_name = "v"
    body.attribute.append(ref)
    leak = function("Leak", [], ["y"], [body])
    leak.attribute_proto.append(helper.make_attribute("v", t))
    call = helper.make_node("Leak", [], ["y"], domain=LOCAL, name="call")
    return model([call], [], [OUT], functions=[leak])


def _tensors_attribute(t: TensorProto) -> onnx.ModelProto:
    node = _constant(helper.make_tensor("v", U8, [16], GOOD, raw=True))
    node.attribute.append(helper.make_attribute("extra", [t]))
    return model([node], [], [OUT])


def _sparse_constant(t: TensorProto) -> onnx.ModelProto:
    indices = helper.make_tensor("i", TensorProto.INT64, [16], list(range(16)))
    sparse = helper.make_sparse_tensor(t, indices, [16])
    return model([helper.make_node("Constant", [], ["y"], sparse_value=sparse)], [], [OUT])


def _sparse_initializer(t: TensorProto) -> onnx.ModelProto:
    indices = helper.make_tensor("i", TensorProto.INT64, [16], list(range(16)))
    t.name = "w"
    result = _constant_node(helper.make_tensor("v", U8, [16], GOOD, raw=True))
    result.graph.sparse_initializer.append(helper.make_sparse_tensor(t, indices, [16]))
    return result


def _training_graph(t: TensorProto) -> onnx.ModelProto:
    result = _constant_node(helper.make_tensor("v", U8, [16], GOOD, raw=True))
    t.name = "w"
    training = result.training_info.add()
    training.initialization.CopyFrom(
        helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "init", [], [OUT], [t])
    )
    return result


Placement = Callable[[TensorProto], onnx.ModelProto]
RUNNABLE: list[Placement] = [
    _initializer,
    _constant_node,
    _branch,
    _branch_initializer,
    _function_constant,
    _nested_function,
    _function_default,
]
EVERYWHERE: list[Placement] = [
    *RUNNABLE,
    _tensors_attribute,
    _sparse_constant,
    _sparse_initializer,
    _training_graph,
]


def _data(location: str) -> TensorProto:
    return external("v", location, [16], U8)


@pytest.fixture
def folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """A model folder, and a working directory beside it holding secrets under every name."""
    models, cwd = tmp_path / "models", tmp_path / "cwd"
    models.mkdir()
    cwd.mkdir()
    for name in ("data.bin", "secret.bin"):
        (cwd / name).write_bytes(SECRET)
    (tmp_path / "secret.bin").write_bytes(SECRET)
    monkeypatch.chdir(cwd)
    yield models, cwd


def _save(folder: Path, proto: onnx.ModelProto) -> Path:
    path = folder / "model.onnx"
    path.write_bytes(proto.SerializeToString())
    return path


@pytest.mark.parametrize("placement", RUNNABLE, ids=lambda p: p.__name__[1:])
def test_external_data_is_read_from_the_model_folder_not_the_working_directory(
    folders: tuple[Path, Path], placement: Placement
) -> None:
    models, _ = folders
    (models / "data.bin").write_bytes(GOOD)
    path = _save(models, placement(_data("data.bin")))
    (y,) = knopt.compile(path).run(None, {})
    assert y.tobytes() == GOOD


@pytest.mark.parametrize("placement", EVERYWHERE, ids=lambda p: p.__name__[1:])
@pytest.mark.parametrize("escape", ["../secret.bin", "absolute"])
def test_external_data_outside_the_model_folder_is_refused_everywhere(
    folders: tuple[Path, Path], placement: Placement, escape: str
) -> None:
    models, _ = folders
    location = str(models.parent / "secret.bin") if escape == "absolute" else escape
    path = _save(models, placement(_data(location)))
    with pytest.raises(InvalidModelError, match="outside the model's folder"):
        knopt.load(path)


@pytest.mark.parametrize("placement", EVERYWHERE, ids=lambda p: p.__name__[1:])
def test_external_data_in_a_model_given_as_bytes_is_refused_everywhere(
    folders: tuple[Path, Path], placement: Placement
) -> None:
    data = placement(_data("data.bin")).SerializeToString()
    with pytest.raises(InvalidModelError, match="from its file path"):
        knopt.load(data)
    with pytest.raises(InvalidModelError, match="from its file path"):
        knopt.compile(data)


def test_external_data_through_a_symlink_out_of_the_folder_is_refused_in_a_function(
    folders: tuple[Path, Path],
) -> None:
    models, cwd = folders
    os.symlink(cwd / "secret.bin", models / "data.bin")
    path = _save(models, _function_constant(_data("data.bin")))
    with pytest.raises(InvalidModelError, match="outside the model's folder"):
        knopt.load(path)


def test_an_imported_model_whose_external_data_was_never_read_is_refused(
    folders: tuple[Path, Path],
) -> None:
    proto = _function_constant(_data("data.bin"))  # built in memory, never through load_model
    with pytest.raises(InvalidModelError, match=r"node .*Constant.*was not read"):
        import_model(proto)


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        ({"offset": "-5"}, "offset '-5'"),
        ({"offset": "ten"}, "offset 'ten'"),
        ({"length": "-1"}, "length '-1'"),
        ({"length": "32"}, "truncated"),
        ({"offset": "100", "length": "16"}, "truncated"),
        ({"offset": "9" * 30, "length": "16"}, "truncated"),
    ],
)
def test_bad_external_data_offsets_and_lengths_name_the_tensor(
    folders: tuple[Path, Path], entries: dict[str, str], fragment: str
) -> None:
    models, _ = folders
    (models / "data.bin").write_bytes(GOOD)
    tensor = _data("data.bin")
    for key, value in entries.items():
        tensor.external_data.append(onnx.StringStringEntryProto(key=key, value=value))
    path = _save(models, _function_constant(tensor))
    with pytest.raises(InvalidModelError, match="tensor 'v'") as caught:
        knopt.load(path)
    assert fragment in str(caught.value)
