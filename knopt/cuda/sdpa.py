"""cuDNN's fused attention (the frontend's SDPA forward, inference) for `Sdpa` steps.

One graph per step shape (views, scale, mask, dtype; no tensors), built when a plan of that
size is first made and kept by the runtime with the other library plans: q, k and v are read in
place through their strides, the output written through its own, grouped-query k and v with
fewer heads than q. The engine is the heuristic's first that builds: cuDNN offers one or two
for attention, so nothing is timed. A graph cuDNN declines (shape, strides, mask, version)
makes the step run knopt's kernel instead (`knopt.cuda.dnn.Dnn.plan` records why).

knopt's causal mask hides keys after `row + t - s` (aligned to the last key): that is cuDNN's
top-left causal mask when s == t and its bottom-right one otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import cudnn

from knopt.cuda.steps import AttentionView, Sdpa
from knopt.errors import CudaError
from knopt.ir.dtype import DType

_TYPES = {DType.F16: cudnn.data_type.HALF, DType.BF16: cudnn.data_type.BFLOAT16}


class SdpaPlan:
    """A built cuDNN attention graph for one `Sdpa` step (its tensors numbered as the plan's).

    Attributes:
        workspace: Bytes of workspace the plan needs.
        fused: Always True: nothing of the step runs after the call.

    Raises:
        Exception: Whatever the frontend raises for a graph it cannot serve.
    """

    fused = True

    def __init__(self, handle: Any, step: Sdpa) -> None:
        self.handle = handle
        self.step = step
        io = _TYPES[step.dtype]
        graph = cudnn.pygraph(
            io_data_type=io,
            intermediate_data_type=cudnn.data_type.FLOAT,
            compute_data_type=cudnn.data_type.FLOAT,
            handle=handle,
        )

        def tensor(name: str, view: AttentionView) -> Any:
            return graph.tensor(
                name=name, dim=list(view.dims), stride=list(view.strides), data_type=io
            )

        self.q = tensor("Q", step.q_view)
        self.k = tensor("K", step.k_view)
        self.v = tensor("V", step.v_view)
        options: dict[str, Any] = {"attn_scale": float(step.scale), "name": "sdpa"}
        self.bias = None
        if step.bias_view is not None:
            self.bias = options["bias"] = tensor("Bias", step.bias_view)
        if step.causal:
            square = step.q_view.dims[2] == step.k_view.dims[2]
            options["use_causal_mask" if square else "use_causal_mask_bottom_right"] = True
        out = _inference_sdpa(graph, self.q, self.k, self.v, options)
        view = step.out_view
        out.set_output(True).set_data_type(io).set_dim(list(view.dims)).set_stride(
            list(view.strides)
        )
        self.out = out
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans(cudnn.build_plan_policy.HEURISTICS_CHOICE)
        self.graph = graph
        self.workspace = int(graph.get_workspace_size())

    def enqueue(self, addresses: Mapping[int, int], workspace: int, stream: int) -> None:
        """Queue the attention on `stream` (addresses by plan tensor id).

        Raises:
            CudaError: If cuDNN fails to launch it.
        """
        step = self.step
        pack = {
            self.q: addresses[step.q],
            self.k: addresses[step.k],
            self.v: addresses[step.v],
            self.out: addresses[step.out],
        }
        if self.bias is not None:
            assert step.bias is not None
            pack[self.bias] = addresses[step.bias]
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
