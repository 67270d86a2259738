"""Serving knopt models on Ray Serve: replicas, dynamic batching, a shared compile cache.

    from ray import serve
    import knopt.serve

    app = knopt.serve.deployment("model.onnx", device="cuda", precision="fp16")
    handle = serve.run(app)                            # or: knopt serve model.onnx
    outputs = handle.run.remote({"x": x}).result()     # {output name: array}

Everything but `deployment`'s replicas imports without Ray; the replicas need
`pip install knopt[serve]`.
"""

from knopt.serve.app import DEFAULT_CACHE, deployment
from knopt.serve.batching import Batcher, BatchStats, pack, padded_size
from knopt.serve.spec import ModelSpec, TensorSpec

__all__ = [
    "DEFAULT_CACHE",
    "BatchStats",
    "Batcher",
    "ModelSpec",
    "TensorSpec",
    "deployment",
    "pack",
    "padded_size",
]
