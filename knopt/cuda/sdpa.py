"""cuDNN's fused attention (the frontend's SDPA forward, inference) for `Sdpa` steps.

One graph per step shape (views, scale, mask, dtype; no tensors), kept by the runtime with the
other library plans. The first is built when a plan first needs it; cuDNN compiles a kernel for
each shape (40-700 ms), so later shapes (a new input size) are built in a helper process
(`knopt.cuda.sdpa_worker`) while the step runs knopt's kernel, and the plan, serialized there,
is loaded here (about 5 ms) when ready. In the graph: q, k and v are read in
place through their strides, the output written through its own, grouped-query k and v with
fewer heads than q. The engine is the heuristic's first that builds: cuDNN offers one or two
for attention, so nothing is timed. A graph cuDNN declines (shape, strides, mask, version)
makes the step run knopt's kernel instead (`knopt.cuda.dnn.Dnn.plan` records why).

knopt's causal mask hides keys after `row + t - s` (aligned to the last key): that is cuDNN's
top-left causal mask when s == t and its bottom-right one otherwise.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import cudnn

from knopt.cuda.sdpa_worker import DTYPE_NAMES, graph_spec, serve
from knopt.cuda.steps import Sdpa
from knopt.errors import CudaError
from knopt.ir.dtype import DType

_TYPES = {DType.F16: cudnn.data_type.HALF, DType.BF16: cudnn.data_type.BFLOAT16}
# The graph's tensors by uid, so a plan loaded from bytes binds its operands as a built one.
Q, K, V, OUT, BIAS = 1, 2, 3, 4, 5


def build_graph(handle: Any, spec: Mapping[str, Any]) -> Any:
    """The attention graph of a `knopt.cuda.sdpa_worker.graph_spec`, its cuDNN plan built.

    The plan is the heuristic's first that builds.

    Raises:
        Exception: Whatever the frontend raises for a graph it cannot serve.
    """
    io = {name: _TYPES[dtype] for dtype, name in DTYPE_NAMES.items()}[spec["dtype"]]
    graph = cudnn.pygraph(
        io_data_type=io,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=handle,
    )

    def tensor(name: str, uid: int) -> Any:
        dims, strides = spec[name]
        return graph.tensor(name=name, dim=dims, stride=strides, data_type=io, uid=uid)

    q, k, v = tensor("q", Q), tensor("k", K), tensor("v", V)
    options: dict[str, Any] = {"attn_scale": spec["scale"], "name": "sdpa"}
    if spec["bias"] is not None:
        options["bias"] = tensor("bias", BIAS)
    if spec["causal"]:
        square = spec["q"][0][2] == spec["k"][0][2]
        options["use_causal_mask" if square else "use_causal_mask_bottom_right"] = True
    out = _inference_sdpa(graph, q, k, v, options)
    dims, strides = spec["out"]
    out.set_output(True).set_data_type(io).set_dim(dims).set_stride(strides).set_uid(OUT)
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans(cudnn.build_plan_policy.HEURISTICS_CHOICE)
    return graph


class SdpaPlan:
    """A built cuDNN attention graph for one `Sdpa` step (its tensors numbered as the plan's).

    Args:
        handle: The cuDNN handle that runs it.
        step: The step (canonical: tensors numbered as the plan's).
        blob: The plan as `serialize` wrote it (in another process, `knopt.cuda.sdpa_worker`);
            None: build it here.

    Attributes:
        workspace: Bytes of workspace the plan needs.
        fused: Always True: nothing of the step runs after the call (but its NaN-rows fixup).

    Raises:
        Exception: Whatever the frontend raises for a graph it cannot serve or load.
    """

    fused = True

    def __init__(self, handle: Any, step: Sdpa, blob: bytes | None = None) -> None:
        self.handle = handle
        self.step = step
        if blob is None:
            self.graph = build_graph(handle, graph_spec(step))
        else:
            self.graph = cudnn.pygraph()
            self.graph.deserialize(handle, blob)
        self.workspace = int(self.graph.get_workspace_size())

    def enqueue(self, addresses: Mapping[int, int], workspace: int, stream: int) -> None:
        """Queue the attention on `stream` (addresses by plan tensor id).

        Raises:
            CudaError: If cuDNN fails to launch it.
        """
        step = self.step
        pack = {
            Q: addresses[step.q],
            K: addresses[step.k],
            V: addresses[step.v],
            OUT: addresses[step.out],
        }
        if step.bias is not None:
            pack[BIAS] = addresses[step.bias]
        try:
            cudnn.set_stream(self.handle, stream)
            self.graph.execute(pack, workspace, handle=self.handle)
        except Exception as err:  # the frontend raises RuntimeError and its own types
            raise CudaError("cudnn.execute", None, f"sdpa {step.q_view.dims}: {err}") from err


def _inference_sdpa(graph: Any, q: Any, k: Any, v: Any, options: dict[str, Any]) -> Any:
    """The output of the graph's SDPA node without softmax statistics (inference)."""
    try:
        out, _ = graph.sdpa(q=q, k=k, v=v, generate_stats=False, **options)
    except TypeError:  # a frontend from before `generate_stats` (it took `is_inference`)
        out, _ = graph.sdpa(q=q, k=k, v=v, is_inference=True, **options)
    return out


def main(argv: Sequence[str]) -> None:
    """The helper process of `knopt.cuda.sdpa_worker`: plans for CUDA device `argv[0]`.

    Replies go to the descriptor that was stdout; whatever the libraries print goes to stderr.
    Runs until stdin closes.
    """
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    from cuda.core import Device

    Device(int(argv[0])).set_current()
    handle = cudnn.create_handle()
    serve(sys.stdin.buffer, replies, lambda spec: bytes(build_graph(handle, spec).serialize()))


if __name__ == "__main__":
    main(sys.argv[1:])
