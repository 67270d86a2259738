"""GridSample and RoiAlign import: run-time sampling positions agree with the ONNX reference."""

from __future__ import annotations

import numpy as np
import pytest

from tests.onnx.ops.node_models import assert_matches, node_model


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_matches_the_reference(
    rng: np.random.Generator, mode: str, padding: str, align: int
) -> None:
    x = rng.uniform(-1, 1, (2, 3, 5, 6)).astype(np.float32)
    grid = rng.uniform(-1.3, 1.3, (2, 4, 3, 2)).astype(np.float32)
    model = node_model(
        "GridSample",
        {"x": x, "grid": grid},
        ["y"],
        opset=20,
        mode=mode,
        padding_mode=padding,
        align_corners=align,
    )
    # onnxruntime clamps bicubic taps differently under border padding; the reference (and so
    # the conformance suite) is what knopt follows.
    assert_matches(model, {"x": x, "grid": grid}, oracle="reference", rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_with_boxes_known_only_at_run_time_matches_the_reference(
    rng: np.random.Generator, mode: str
) -> None:
    x = rng.uniform(-1, 1, (2, 3, 8, 8)).astype(np.float32)
    rois = np.array([[0.5, 1.0, 6.0, 5.5], [2.0, 0.0, 7.5, 7.5], [1.0, 1.0, 2.0, 3.0]], np.float32)
    batch = np.array([0, 1, 1], np.int64)
    feeds: dict[str, np.ndarray] = {"x": x, "rois": rois, "batch": batch}
    model = node_model(
        "RoiAlign",
        feeds,
        ["y"],
        opset=16,
        mode=mode,
        output_height=3,
        output_width=2,
        sampling_ratio=2,
        spatial_scale=0.9,
    )
    assert_matches(model, feeds, oracle="reference", rtol=1e-5, atol=1e-6)
