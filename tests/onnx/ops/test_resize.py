"""Resize and Upsample import: every mode and coordinate rule agrees with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import knopt
from knopt.ir.op import Gather
from knopt.onnx.ops.resize import Interpolation, axis_taps, is_one_hot
from knopt.onnx_backend import KnoptBackend
from tests.onnx.ops.node_models import assert_matches, node_model

COORDINATES = [
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
]
NO_ROI = np.zeros(0, np.float32)


def _image(rng: np.random.Generator, shape: tuple[int, ...] = (2, 3, 5, 7)) -> np.ndarray:
    return rng.uniform(-3, 3, shape).astype(np.float32)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("coordinates", COORDINATES)
@pytest.mark.parametrize("scales", [(1.0, 1.0, 2.0, 1.5), (1.0, 1.0, 0.6, 0.8)])
def test_resize_by_scales_matches_onnxruntime(
    rng: np.random.Generator, mode: str, coordinates: str, scales: tuple[float, ...]
) -> None:
    x = _image(rng)
    model = node_model(
        "Resize",
        {"x": x},
        ["y"],
        opset=19,
        constants={"roi": NO_ROI, "scales": np.array(scales, np.float32)},
        mode=mode,
        coordinate_transformation_mode=coordinates,
    )
    assert_matches(model, {"x": x}, oracle="reference", rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
)
def test_resize_nearest_modes_by_sizes_match_onnxruntime(
    rng: np.random.Generator, nearest_mode: str
) -> None:
    x = _image(rng)
    model = node_model(
        "Resize",
        {"x": x},
        ["y"],
        opset=13,
        constants={"roi": NO_ROI, "scales": NO_ROI, "sizes": np.array([2, 3, 8, 4], np.int64)},
        mode="nearest",
        nearest_mode=nearest_mode,
        coordinate_transformation_mode="asymmetric",
    )
    assert_matches(model, {"x": x})


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias_downsampling_matches_onnxruntime(
    rng: np.random.Generator, mode: str
) -> None:
    x = _image(rng, (1, 2, 12, 10))
    model = node_model(
        "Resize",
        {"x": x},
        ["y"],
        opset=18,
        constants={"roi": NO_ROI, "scales": np.array([1, 1, 0.4, 0.7], np.float32)},
        mode=mode,
        antialias=1,
    )
    assert_matches(model, {"x": x}, oracle="reference", rtol=1e-4, atol=1e-5)


def test_resize_cubic_excluding_outside_matches_onnxruntime(rng: np.random.Generator) -> None:
    x = _image(rng)
    model = node_model(
        "Resize",
        {"x": x},
        ["y"],
        opset=19,
        constants={"roi": NO_ROI, "scales": np.array([1, 1, 1.7, 0.7], np.float32)},
        mode="cubic",
        cubic_coeff_a=-0.5,
        exclude_outside=1,
    )
    assert_matches(model, {"x": x}, oracle="reference", rtol=1e-4, atol=1e-5)


def test_crop_and_resize_extrapolates_outside_the_roi(rng: np.random.Generator) -> None:
    x = _image(rng)
    roi = np.array([0, 0, -0.2, 0.3, 1, 1, 0.8, 1.3], np.float32)
    model = node_model(
        "Resize",
        {"x": x},
        ["y"],
        opset=19,
        constants={"roi": roi, "scales": NO_ROI, "sizes": np.array([2, 3, 6, 6], np.int64)},
        mode="linear",
        coordinate_transformation_mode="tf_crop_and_resize",
        extrapolation_value=7.5,
    )
    assert_matches(model, {"x": x}, oracle="reference", rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
def test_resize_axes_and_aspect_policy_match_onnxruntime(
    rng: np.random.Generator, policy: str
) -> None:
    x = _image(rng)
    model = node_model(
        "Resize",
        {"x": x},
        ["y"],
        opset=18,
        constants={"roi": NO_ROI, "scales": NO_ROI, "sizes": np.array([9, 4], np.int64)},
        mode="linear",
        axes=[3, 2],
        keep_aspect_ratio_policy=policy,
    )
    assert_matches(model, {"x": x}, oracle="reference", rtol=1e-4, atol=1e-5)


def test_integer_images_resize_with_rounding_and_saturation(rng: np.random.Generator) -> None:
    x = rng.integers(0, 256, (1, 1, 5, 6)).astype(np.uint8)
    model = node_model(
        "Resize",
        {"x": x},
        ["y"],
        opset=19,
        constants={"roi": NO_ROI, "scales": np.array([1, 1, 1.6, 1.3], np.float32)},
        mode="cubic",
    )
    ours = KnoptBackend.run_model(model, {"x": x})[0]
    reference = _reference(model, x)
    assert ours.dtype == np.uint8
    np.testing.assert_array_equal(ours, reference)


def _reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    outputs = ReferenceEvaluator(model).run(None, {"x": x})
    assert isinstance(outputs, list)
    return np.asarray(outputs[0])


def test_upsample_9_repeats_pixels_like_onnxruntime(rng: np.random.Generator) -> None:
    x = _image(rng, (1, 2, 3, 4))
    model = node_model(
        "Upsample",
        {"x": x},
        ["y"],
        opset=9,
        constants={"scales": np.array([1, 1, 2, 3], np.float32)},
        mode="nearest",
    )
    assert_matches(model, {"x": x})


def test_nearest_resize_is_a_single_gather_per_axis(rng: np.random.Generator) -> None:
    x = _image(rng)
    model = node_model(
        "Resize",
        {"x": x},
        ["y"],
        opset=19,
        constants={"roi": NO_ROI, "scales": np.array([1, 1, 2, 2], np.float32)},
        mode="nearest",
    )
    graph = knopt.load(model.SerializeToString())
    assert sum(isinstance(n.op, Gather) for n in graph.nodes) == 2


def test_linear_taps_hold_two_weights_summing_to_one() -> None:
    taps = axis_taps(Interpolation(mode="linear"), 5, 8, 1.6, (0.0, 1.0))
    assert taps.indices.shape == (8, 2)
    np.testing.assert_allclose(taps.weights.sum(axis=1), 1.0)
    assert not is_one_hot(taps)


def test_resize_keeps_a_symbolic_batch_size(rng: np.random.Generator) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    scales = helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 2, 2])
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")
    graph = helper.make_graph([node], "resize", [x], [y], [scales])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    session = knopt.compile(model.SerializeToString())
    for batch in (1, 3):
        feed = _image(rng, (batch, 3, 4, 4))
        (out,) = session.run(None, {"x": feed})
        np.testing.assert_allclose(out, _reference(model, feed), rtol=1e-5, atol=1e-6)
