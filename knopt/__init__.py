"""knopt: an optimizing compiler for neural networks.

ONNX models are loaded into a small graph IR, optimized by equality saturation over rewrite
rules written in egglog (`rules/*.egg`), and run on the CPU (numpy, the reference) or on NVIDIA
GPUs.

    import knopt
    session = knopt.compile("model.onnx")
    (logits,) = session.run(None, {"x": x})
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knopt.errors import (
    CodegenError,
    CudaError,
    InputError,
    InvalidGraphError,
    InvalidModelError,
    KnoptError,
    MemoryLimitError,
    OptimizeError,
    ResultError,
    RuleFileError,
    RunError,
    SymbolicSizeError,
    UnsupportedModelError,
    UnsupportedOpError,
    UsageError,
)
from knopt.ir.dims import SizeProfile, SizeRange
from knopt.ir.graph import Graph
from knopt.ir.memory import set_memory_limit
from knopt.onnx.export import DEFAULT_OPSET, save_onnx
from knopt.onnx.export_kernels import save_kernels
from knopt.onnx.load import import_model, input_symbols, load_model
from knopt.opt.egraph import DEFAULT_LIMITS, Limits
from knopt.opt.optimize import OptimizeResult
from knopt.opt.optimize import optimize as run_optimizer
from knopt.session import PerSizeSession, Session
from knopt.version import __version__

if TYPE_CHECKING:
    from onnx import ModelProto

    from knopt.cache import ProgramCache
    from knopt.opt.cost import DeviceProfile
    from knopt.opt.rules import RuleFile


def load(
    source: str | os.PathLike[str] | bytes,
    dims: Mapping[str, int] | None = None,
    *,
    strict: bool = False,
) -> Graph:
    """Load an ONNX model (a path or the bytes of one) as an IR graph.

    A node of an op knopt lacks is kept as it is, an opaque op: the optimizer works around it,
    `save` writes it back unchanged, and the CPU runs it where onnx's reference evaluator has
    the op.

    Args:
        source: The model file, or its contents.
        dims: Values for symbolic input sizes, by name (such as `{"batch": 1}`); sizes not
            given stay symbolic and are bound when the model runs.
        strict: Refuse ops knopt lacks instead of keeping them.

    Raises:
        InvalidModelError: If the file is not a readable ONNX model.
        UnsupportedModelError: If the model uses something knopt does not support (with
            `strict`, any op it lacks).
        InvalidGraphError: If the model's graph is malformed.
    """
    return import_model(load_model(source), dims, strict=strict)


def save(
    model: Graph | OptimizeResult,
    path: str | os.PathLike[str] | None = None,
    *,
    kernels: bool = False,
    opset: int = DEFAULT_OPSET,
    target: str = "onnx",
) -> ModelProto:
    """Export a graph, or an optimization's result, as ONNX: recognised patterns as fused ops.

    Args:
        model: A graph, or what `optimize` returned (its optimized graph is saved).
        path: Where to write the model, or None to only return it.
        kernels: For an optimization's result: save the kernel grouping instead (each
            fused kernel a `knopt`-domain function, to inspect fusion in Netron).
        opset: The version of the default ONNX domain to write (18 or newer). Symbolic sizes
            stay symbolic (dynamic axes keep working).
        target: "onnx" for standard ops only; "onnxruntime" to also use onnxruntime's
            com.microsoft fused ops.

    Raises:
        UnsupportedModelError: If the graph needs something the opset lacks.
        KnoptError: If the file cannot be written.
    """
    graph = model if isinstance(model, Graph) else model.graph
    if kernels and isinstance(model, OptimizeResult):
        return save_kernels(graph, model.groups, model.group_kinds, path, opset=opset)
    return save_onnx(graph, path, opset=opset, target=target)


def optimize(
    graph: Graph,
    *,
    rules: Sequence[str | Path | RuleFile] = (),
    profile: str | os.PathLike[str] | DeviceProfile = "cpu",
    limits: Limits = DEFAULT_LIMITS,
    ilp: bool = True,
    sizes: Mapping[str, int] | None = None,
    progress: Callable[[str], None] | None = None,
    strict: bool = False,
) -> OptimizeResult:
    """Optimize a graph by equality saturation and cost-based extraction.

    Phase 1 rewrites the graph with the algebra rules and extracts the cheapest program of ops;
    phase 2 groups that program's ops into fused kernels. Symbolic sizes stay symbolic.

    Args:
        graph: The graph to optimize (it is not changed).
        rules: Extra rule files (paths or `knopt.opt.RuleFile`s), run with the shipped ones.
        profile: The device whose costs guide extraction: "cpu", "h200", "h200-graph", a
            profile file written by `knopt calibrate`, or a `DeviceProfile`.
        limits: Saturation bounds per phase (`knopt.opt.Limits(seconds=..., nodes=...)`);
            hitting one keeps the best e-graph so far.
        ilp: Whether to refine extraction with an ILP where it can pay off.
        sizes: The representative value of named symbolic sizes, at which kernels are costed.
        progress: Called with a short line as each phase starts, for a status display.
        strict: Refuse a graph that holds opaque ops (ONNX nodes of ops knopt lacks, kept as
            they are); without it, the optimizer works around them.

    Returns:
        The optimized graph (`.graph`), its kernels (`.program`) and what was done (`.report`).

    Raises:
        RuleFileError: If a rule file is malformed.
        OptimizeError: If the rules or extraction produce something unusable.
        UnsupportedOpError: With `strict`, if the graph holds an opaque op.
    """
    return run_optimizer(
        graph,
        rules=rules,
        profile=profile,
        limits=limits,
        ilp=ilp,
        sizes=sizes,
        progress=progress,
        strict=strict,
    )


def compile(
    model: Graph | str | os.PathLike[str] | bytes,
    device: str = "cpu",
    *,
    precision: str = "f32",
    optimize: bool | None = None,
    profile: str | os.PathLike[str] | DeviceProfile | None = None,
    dims: Mapping[str, int | tuple[int, int, int] | SizeRange] | None = None,
    resident: Mapping[str, str] | None = None,
    cache_mask: str | None = None,
    cache: str | os.PathLike[str] | ProgramCache | None = None,
    strict: bool = False,
) -> Session:
    """Prepare a model to run on a device, for every size its symbolic dimensions take.

    The model is optimized once (on the first run), with symbolic sizes kept symbolic; each
    new set of input sizes is then only bound and planned (milliseconds).

        session = knopt.compile("bert.onnx", "cuda", dims={"batch": (1, 8, 64),
                                                           "seq": (1, 128, 512)})

    Args:
        model: A graph, or an ONNX model's path or bytes.
        device: "cpu", "cuda", or "best" (cuda if a GPU is usable).
        precision: On cuda, "f32" (strict, no TF32), "tf32", "fp16" or "bf16". The CPU
            computes in f32 only: another precision is refused on "cpu", and on "best"
            without a GPU it is a warning (the run is in f32).
        optimize: Run the optimizer first (once). The default is True on cuda, where fused
            kernels are the point, and False on cpu, whose executor is the reference that
            optimized programs are checked against.
        profile: The cost model for optimizing: "cpu", "h200", "h200-graph", a file written
            by `knopt calibrate`, or a `DeviceProfile` (default: the device's built-in one).
        dims: Symbolic sizes by name, in the style of TensorRT's optimization profiles:
            `(min, opt, max)` bounds a size (a run outside is refused with `InputError`) and
            `opt` is the size kernels are costed at; an int fixes the size.
        resident: Outputs kept after each run and fed back as the matching inputs of the next
            (a decoder's key/value caches: `{"present.0.key": "past_key_values.0.key"}`).
        cache_mask: With `resident`: the attention mask input, which makes the caches static
            (see `knopt.ir.kvcache`).
        cache: When optimizing, a folder (or `knopt.cache.ProgramCache`) shared by processes:
            the optimized program is read from it if there, else made and written for the
            others (on cuda, with NVRTC's cubins). Entries of another knopt build, GPU, model
            or profile are ignored.
        strict: Refuse ops knopt lacks when loading, instead of keeping them as they are
            (opaque ops, which the CPU runs where onnx's reference evaluator has the op).

    Raises:
        UsageError: If the device or precision is unknown, or not f32 on "cpu".
        KnoptError: If loading fails or the device is not available.
        InputError: If `dims` names a size the model does not have, or a range is malformed.
        UnsupportedOpError: If the model holds an op knopt lacks that the device cannot run.
    """
    options: dict[str, Any] = {
        "precision": precision,
        "optimize": optimize,
        "profile": profile,
        "cache": cache,
    }
    if isinstance(model, Graph):
        return Session(
            model, device, dims=dims, resident=resident, cache_mask=cache_mask, **options
        )
    proto = load_model(model)
    ranges = SizeProfile.parse(dims, input_symbols(proto))
    fixed = ranges.fixed
    try:
        graph = import_model(proto, fixed, strict=strict)
    except SymbolicSizeError:
        # Only fixed sizes import (an RNN over a dynamic sequence, ...): import at each run.
        if resident:
            raise
        return PerSizeSession(proto, device, dims=dict(ranges.ranges), **options)
    free = {name: spec for name, spec in ranges.ranges.items() if name not in fixed}
    return Session(graph, device, dims=free, resident=resident, cache_mask=cache_mask, **options)


__all__ = [
    "CodegenError",
    "CudaError",
    "Graph",
    "InputError",
    "InvalidGraphError",
    "InvalidModelError",
    "KnoptError",
    "MemoryLimitError",
    "OptimizeError",
    "ResultError",
    "RuleFileError",
    "RunError",
    "Session",
    "SymbolicSizeError",
    "UnsupportedModelError",
    "UnsupportedOpError",
    "UsageError",
    "__version__",
    "compile",
    "load",
    "optimize",
    "save",
    "set_memory_limit",
]
