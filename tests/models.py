"""The committed real-model fixtures (tests/fixtures/models) and random inputs for them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MODELS = Path(__file__).parent / "fixtures" / "models"


@dataclass(frozen=True)
class Fixture:
    """One exported model file and what its inputs look like."""

    file: str
    model: str
    style: str
    inputs: list[dict[str, Any]]

    @property
    def path(self) -> Path:
        """Where the .onnx file is."""
        return MODELS / self.file

    def feeds(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Random non-zero inputs of the manifest's test shapes."""
        rng = np.random.default_rng(seed)
        feeds = {}
        for spec in self.inputs:
            if spec["dtype"] == "float32":
                feeds[spec["name"]] = rng.standard_normal(spec["shape"]).astype(np.float32)
            else:
                low, high = spec["range"]
                values = rng.integers(low, high, spec["shape"]).astype(np.int64)
                if spec.get("first_position_one"):
                    values[..., 0] = 1
                feeds[spec["name"]] = values
        return feeds


def fixtures() -> list[Fixture]:
    """Every model in the manifest."""
    manifest = json.loads((MODELS / "manifest.json").read_text())
    return [
        Fixture(entry["file"], entry["model"], entry["style"], entry["inputs"])
        for entry in manifest["files"]
    ]
