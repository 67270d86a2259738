"""`deployment()`: a knopt model as a Ray Serve application."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knopt.errors import KnoptError

if TYPE_CHECKING:
    from ray.serve import Application

DEVICES = ("cpu", "cuda")
DEFAULT_CACHE = "~/.cache/knopt"  # expanded on each node: ~/.cache/knopt/{programs,cubin}
# Requests a model replica takes at once: a running batch and a full one waiting, and at least
# MIN_ONGOING. Past the limit, Serve's routers hold requests and retry with growing back-off
# (measured: 16 one-row clients on one unbatched replica, p50 280 ms at a limit of 2), which a
# short queue inside the replica avoids.
MIN_ONGOING = 16
INGRESS_ONGOING = 1000


def deployment(
    model: str | os.PathLike[str],
    *,
    device: str = "cuda",
    precision: str = "f32",
    max_batch_size: int = 32,
    batch_wait_timeout_s: float = 0.002,
    num_replicas: int | str = "auto",
    optimize: bool | None = True,
    profile: str | None = None,
    cache: str | os.PathLike[str] | None = DEFAULT_CACHE,
) -> Application:
    """A Serve application that runs `model` with knopt, batching concurrent requests.

    Run it with `serve.run(app)` (which returns a handle: `handle.run.remote({"x": x})`) or
    `knopt serve model.onnx`. Clients POST JSON or .npz bodies (`knopt.serve.protocol`).

    Args:
        model: The .onnx file; it must be readable at this path on every node.
        device: "cuda" (one GPU per replica) or "cpu".
        precision: On cuda, "f32", "tf32", "fp16" or "bf16".
        max_batch_size: The most rows one session run takes; concurrent requests are stacked
            along the batch axis up to this and padded to batch sizes compiled already.
        batch_wait_timeout_s: How long a replica waits for a batch to fill.
        num_replicas: A number, or "auto": on cuda one replica per GPU of the Ray cluster
            (connecting to Ray as `serve.run` would, if not connected yet); on cpu, Serve's
            autoscaling between 1 and half the cluster's CPUs.
        optimize: Optimize each compiled batch size (default; on cpu, False serves knopt's
            reference executor instead).
        profile: The optimizer's cost model (default: the device's).
        cache: The folder of compiled programs that replicas share (a shared filesystem on a
            cluster); "~" means each node's home. None compiles in every replica.

    Raises:
        KnoptError: If an argument is invalid, the model file is missing, Ray Serve is not
            installed, or "auto" finds no GPU in the cluster.
    """
    if device not in DEVICES:
        raise KnoptError(f"device '{device}' cannot be served (use {' or '.join(DEVICES)})")
    if max_batch_size < 1 or batch_wait_timeout_s < 0:
        raise KnoptError("max_batch_size must be at least 1 and batch_wait_timeout_s >= 0")
    path = Path(model).expanduser().resolve()
    if not path.is_file():
        raise KnoptError(f"model {model}: no such file")
    try:
        from ray import serve

        from knopt.serve.replica import Ingress, ModelReplica, ReplicaOptions
    except ImportError as err:
        raise KnoptError(f"serving needs Ray Serve ({err}): pip install 'knopt[serve]'") from err
    options = ReplicaOptions(
        device=device,
        precision=precision,
        optimize=optimize,
        profile=profile,
        cache=None if cache is None else os.fspath(cache),
        max_batch_size=max_batch_size,
        batch_wait_timeout_s=batch_wait_timeout_s,
    )
    scaling = _scaling(device, num_replicas, max_batch_size)
    resources: dict[str, Any] = {"num_cpus": 1, "num_gpus": 1 if device == "cuda" else 0}
    replicas = serve.deployment(
        name="KnoptModel",
        ray_actor_options=resources,
        max_ongoing_requests=max(2 * max_batch_size, MIN_ONGOING),
        **scaling,
    )(ModelReplica).bind(str(path), options)
    # The ingress only reads bodies and forwards: it takes no CPU of its own, and a request it
    # holds costs it next to nothing.
    ingress = serve.deployment(
        name="KnoptIngress",
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=INGRESS_ONGOING,
        **scaling,
    )(Ingress)
    return ingress.bind(replicas)


def _scaling(device: str, num_replicas: int | str, max_batch_size: int) -> dict[str, Any]:
    """Serve's `num_replicas` or `autoscaling_config` for the deployments."""
    if isinstance(num_replicas, int) and not isinstance(num_replicas, bool):
        if num_replicas < 1:
            raise KnoptError(f"num_replicas must be at least 1, not {num_replicas}")
        return {"num_replicas": num_replicas}
    if num_replicas != "auto":
        raise KnoptError(f"num_replicas must be a number or 'auto', not {num_replicas!r}")
    resources = _cluster_resources()
    if device == "cuda":
        gpus = int(resources.get("GPU", 0))
        if gpus < 1:
            raise KnoptError(
                "num_replicas='auto' found no GPU in the Ray cluster: serve on device='cpu' "
                "or start Ray on GPU machines"
            )
        return {"num_replicas": gpus}
    most = max(1, int(resources.get("CPU", 1)) // 2)
    return {
        "num_replicas": "auto",
        "autoscaling_config": {
            "min_replicas": 1,
            "max_replicas": most,
            "target_ongoing_requests": max_batch_size,
        },
    }


def _cluster_resources() -> dict[str, float]:
    import ray

    if not ray.is_initialized():
        ray.init()
    resources: dict[str, float] = ray.cluster_resources()
    return resources
