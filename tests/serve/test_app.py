"""`deployment()`: arguments checked early, replicas sized from the cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from knopt.errors import KnoptError
from knopt.serve import app
from tests.models import MODELS

MODEL = MODELS / "mlp_ts14.onnx"


def test_bad_arguments_fail_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(KnoptError, match="device 'tpu' cannot be served"):
        app.deployment(MODEL, device="tpu")
    with pytest.raises(KnoptError, match="max_batch_size"):
        app.deployment(MODEL, device="cpu", max_batch_size=0)
    with pytest.raises(KnoptError, match="no such file"):
        app.deployment(tmp_path / "missing.onnx", device="cpu")
    with pytest.raises(KnoptError, match="at least 1"):
        app.deployment(MODEL, device="cpu", num_replicas=0)
    with pytest.raises(KnoptError, match="a number or 'auto'"):
        app.deployment(MODEL, device="cpu", num_replicas="many")


def test_auto_replicas_are_one_per_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app, "_cluster_resources", lambda: {"CPU": 64.0, "GPU": 8.0})
    assert app._scaling("cuda", "auto", 32) == {"num_replicas": 8}
    monkeypatch.setattr(app, "_cluster_resources", lambda: {"CPU": 64.0})
    with pytest.raises(KnoptError, match="no GPU in the Ray cluster"):
        app._scaling("cuda", "auto", 32)


def test_auto_replicas_on_cpu_autoscale(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app, "_cluster_resources", lambda: {"CPU": 2.0})
    scaling = app._scaling("cpu", "auto", 16)
    assert scaling["num_replicas"] == "auto"
    assert scaling["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 1,
        "target_ongoing_requests": 16,
    }


def test_application_has_an_ingress_and_model_replicas() -> None:
    application = app.deployment(MODEL, device="cpu", num_replicas=2, max_batch_size=8)
    ingress = application._bound_deployment
    assert ingress.name == "KnoptIngress"
    (model,) = ingress.init_args
    replicas = model._bound_deployment
    assert (replicas.name, replicas.num_replicas) == ("KnoptModel", 2)
    assert replicas.ray_actor_options["num_gpus"] == 0
    assert replicas.max_ongoing_requests == 16  # a batch running and the next one filling
    wide = app.deployment(MODEL, device="cpu", num_replicas=1, max_batch_size=32)
    assert wide._bound_deployment.init_args[0]._bound_deployment.max_ongoing_requests == 64
