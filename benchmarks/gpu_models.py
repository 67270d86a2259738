"""The models of benchmarks/gpu.py: random weights, inputs, ONNX export, and their work.

Each model is built once on the CPU with a fixed seed (so every copy holds the same weights),
with its transformers attention set to "eager" for the ONNX export and "sdpa" for torch's runs.
Text models take 128 token ids and images 224x224 pictures; every model returns one tensor.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SEQ = 128
IMAGE = 224


class LastHidden(torch.nn.Module):
    """A transformers model returning its last hidden state only (what is exported).

    Decoders get an all-ones attention mask: without one, transformers probes the position ids
    for packed sequences with `diff`, which the TorchScript exporter lacks.
    """

    def __init__(self, model: torch.nn.Module, argument: str, mask: bool = False) -> None:
        super().__init__()
        self.model = model
        self.argument = argument
        self.mask = mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The last hidden state for input `x`."""
        extra = {"attention_mask": torch.ones_like(x)} if self.mask else {}
        output: Any = self.model(**{self.argument: x}, **extra, return_dict=True)
        return output.last_hidden_state

    def set_attention(self, implementation: str) -> None:
        """Use transformers' `implementation` of attention ("eager", "sdpa")."""
        setter: Any = self.model.set_attn_implementation
        setter(implementation)


def _resnet50() -> torch.nn.Module:
    import torchvision

    return torchvision.models.resnet50(weights=None)


def _bert() -> torch.nn.Module:
    import transformers

    config = transformers.BertConfig()  # BERT-base: 12 layers, hidden 768
    return LastHidden(transformers.BertModel(config, add_pooling_layer=False), "input_ids")


def _gpt2() -> torch.nn.Module:
    import transformers

    config = transformers.GPT2Config(use_cache=False)  # GPT-2 small: 12 layers, hidden 768
    return LastHidden(transformers.GPT2Model(config), "input_ids", mask=True)


def _vit() -> torch.nn.Module:
    import transformers

    config = transformers.ViTConfig()  # ViT-B/16 at 224: 197 tokens, 12 layers, hidden 768
    return LastHidden(transformers.ViTModel(config, add_pooling_layer=False), "pixel_values")


def _llama() -> torch.nn.Module:
    import transformers

    # TinyLlama-1.1B's shape: 22 layers, hidden 2048, grouped-query attention (32 heads, 4 KV).
    config = transformers.LlamaConfig(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        vocab_size=32000,
        max_position_embeddings=2048,
        use_cache=False,
    )
    return LastHidden(transformers.LlamaModel(config), "input_ids", mask=True)


@dataclass(frozen=True)
class ModelSpec:
    """How to build a model and what it takes."""

    name: str
    build: Callable[[], torch.nn.Module]
    text: bool  # token ids in, else an image


MODELS = {
    spec.name: spec
    for spec in (
        ModelSpec("resnet50", _resnet50, False),
        ModelSpec("bert", _bert, True),
        ModelSpec("gpt2", _gpt2, True),
        ModelSpec("vit", _vit, False),
        ModelSpec("llama", _llama, True),
    )
}


def build(spec: ModelSpec) -> torch.nn.Module:
    """The model with its seeded random weights, in eval mode, on the CPU."""
    torch.manual_seed(0)
    return spec.build().eval()


def set_attention(model: torch.nn.Module, implementation: str) -> None:
    """Pick transformers' attention implementation (a no-op for torchvision models)."""
    if isinstance(model, LastHidden):
        model.set_attention(implementation)


def example(spec: ModelSpec, batch: int, device: str = "cuda") -> torch.Tensor:
    """The model's input at `batch` (token ids, or an f32 image)."""
    generator = torch.Generator().manual_seed(1)
    if spec.text:
        return torch.randint(0, 30000, (batch, SEQ), generator=generator).to(device)
    return torch.randn(batch, 3, IMAGE, IMAGE, generator=generator).to(device)


def export(model: torch.nn.Module, spec: ModelSpec, folder: Path, batch: int) -> Path:
    """ONNX export with a symbolic batch (TorchScript exporter), else static (dynamo).

    Returns the file; exports made once per model (or per batch for the static fallback) are
    reused. Models past 2 GB keep their weights in a file beside it.
    """
    dynamic = folder / f"{spec.name}.onnx"
    if dynamic.exists():
        return dynamic
    static = folder / f"{spec.name}_{batch}.onnx"
    if static.exists():
        return static
    set_attention(model, "eager")
    x = example(spec, 2 if batch == 1 else batch, "cpu")
    name = "input_ids" if spec.text else "pixel_values"
    try:
        with torch.no_grad():
            torch.onnx.export(
                model,
                (x,),
                str(dynamic),
                input_names=[name],
                output_names=["output"],
                dynamic_axes={name: {0: "batch"}, "output": {0: "batch"}},
                opset_version=17,
                dynamo=False,
            )
        return dynamic
    except Exception as err:  # exporters differ between torch releases: try the other one
        print(f"  torchscript export failed ({err}); dynamo at batch {batch}", file=sys.stderr)
    x = example(spec, batch, "cpu")
    with torch.no_grad():
        torch.onnx.export(
            model,
            (x,),
            str(static),
            input_names=[name],
            output_names=["output"],
            opset_version=18,
            dynamo=True,
        )
    return static


def count_flops(model: torch.nn.Module, x: torch.Tensor) -> float:
    """The model's matmul, convolution and attention FLOPs on `x` (torch's flop counter)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(x)
    return float(counter.get_total_flops())


def count_bytes(model: torch.nn.Module, x: torch.Tensor, out: torch.Tensor, item: int) -> float:
    """Bytes a run must move at least: the weights once, input and output.

    An embedding table counts only the rows the input looks up.
    """
    lookups = x.numel() if not x.is_floating_point() else 0
    total = 0.0
    embedded = set()
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            rows = min(module.num_embeddings, lookups) if lookups else module.num_embeddings
            total += rows * module.embedding_dim * item
            embedded.add(id(module.weight))
    for parameter in model.parameters():
        if id(parameter) not in embedded:
            total += parameter.numel() * item
    for buffer in model.buffers():
        if buffer.is_floating_point():
            total += buffer.numel() * item
    total += x.numel() * (x.element_size() if not x.is_floating_point() else item)
    return total + out.numel() * item
