"""LLM decoding with a key/value cache: a ~1B-parameter LLaMA-class decoder (GPU, fp16).

    python benchmarks/decode.py            # 16 layers (~0.95B parameters), 256 new tokens
    python benchmarks/decode.py --quick    # 4 layers, 64 new tokens
    python benchmarks/decode.py --quick --profile   # then where knopt's host time goes
    python benchmarks/decode.py --kernels   # then knopt's GPU kernels a step (KNOPT_PDL=0)
    python benchmarks/decode.py --exporter dynamo   # exported by torch.export (opset 18)

A randomly initialised LLaMA decoder (transformers, no download; hidden 2048, 16 heads of 128,
no grouped-query attention, SwiGLU 5632, vocab 32000) is exported in fp16 with its cache as
flat inputs and outputs (`tests/fixtures/make_decoder.py`), and compiled by knopt once with
`resident` caches and `cache_mask`: a static cache of prompt + new tokens, whose decoding steps
replay one CUDA graph per bucket of 64 lengths. Greedy decoding, batch 1 and 8, prompt 128:

- knopt: time to first token (the prefill), then decoding tokens per second; the second of two
  generations (the first pays the optimizer and compiles, reported apart);
- torch eager with a static cache (`generate(cache_implementation="static",
  disable_compile=True)`) and torch.compile of the decode step (the same without
  `disable_compile`: transformers compiles the forward with its CompileConfig);
- the weight-bandwidth bound: parameters x 2 bytes read per step at 4.2 TB/s.

Targets (issue #12): knopt's tokens/s >= torch.compile's at batch 1, and >= 80% of the bound.
Needs a CUDA GPU, torch and transformers.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import knopt  # noqa: E402
from tests.fixtures.make_decoder import (  # noqa: E402
    DecoderStep,
    export_dynamo,
    export_torchscript,
)

BANDWIDTH = 4.2e12  # bytes per second, H200 HBM3e
PROMPT = 128


def build(layers: int) -> Any:
    """The random decoder in fp16 on the GPU."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    options: dict[str, Any] = {
        "vocab_size": 32000,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": layers,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "max_position_embeddings": 4096,
        "attn_implementation": "sdpa",
    }
    config = LlamaConfig(**options)
    return LlamaForCausalLM(config).half().cuda().eval()


def export(model: Any, folder: Path, exporter: str) -> Path:
    """The decoder exported with its cache (fp16, dynamic batch, seq and past).

    TorchScript's export of the attention adds f32 masks to the f16 scores, so the scores,
    softmax and `probabilities @ v` are f32 (and not one fused Attention, whose operands
    share one type); torch.export keeps them f16.
    """
    import torch

    step = DecoderStep(model)
    config = model.config
    head = config.hidden_size // config.num_attention_heads
    shape = (2, config.num_key_value_heads, 3, head)
    past = [
        torch.zeros(shape, dtype=torch.float16, device="cuda")
        for _ in range(2 * config.num_hidden_layers)
    ]
    ids = torch.ones(2, 2, dtype=torch.int64, device="cuda")
    mask = torch.ones(2, 5, dtype=torch.int64, device="cuda")
    positions = torch.tensor([[3, 4], [3, 4]], device="cuda")
    path = folder / "decoder.onnx"
    with torch.no_grad():
        writer = export_dynamo if exporter == "dynamo" else export_torchscript
        writer(step, (ids, mask, positions, *past), path)
    return path


def knopt_generate(
    session: knopt.Session, prompt: Any, new: int
) -> tuple[float, float, Any, float]:
    """Greedy decoding: (first token s, rest s, the tokens, host s for the rest).

    The host's time for the rest is the time to queue the steps, before waiting for the GPU.
    Nothing waits for the GPU until the end: each run is queued and returns its logits on the
    GPU; `torch.from_dlpack` makes torch's stream wait for the run, and the next run waits for
    torch's stream (the argmax that writes its input ids), so the host prepares step i + 1
    while the GPU computes step i. Positions and the mask are small host arrays, uploaded.
    """
    import torch

    batch = prompt.shape[0]
    session.reset()
    ids = torch.empty((batch, 1), dtype=torch.int64, device="cuda")  # one address: one graph
    torch.cuda.synchronize()
    began = time.perf_counter()
    feeds = {
        "input_ids": prompt,
        "attention_mask": np.ones((batch, PROMPT), np.int64),
        "position_ids": np.tile(np.arange(PROMPT), (batch, 1)),
    }
    (logits,) = session.run(["logits"], feeds, device_outputs=True)
    ids.copy_(torch.from_dlpack(logits)[:, -1].argmax(-1, keepdim=True))
    torch.cuda.synchronize()
    first = time.perf_counter() - began
    tokens = [ids.clone()]
    began = time.perf_counter()
    for i in range(PROMPT, PROMPT + new - 1):
        feeds = {
            "input_ids": ids,
            "attention_mask": np.ones((batch, i + 1), np.int64),
            "position_ids": np.full((batch, 1), i, np.int64),
        }
        (logits,) = session.run(["logits"], feeds, device_outputs=True)
        ids.copy_(torch.from_dlpack(logits)[:, -1].argmax(-1, keepdim=True))
        tokens.append(ids.clone())
    queued = time.perf_counter() - began
    torch.cuda.synchronize()
    return first, time.perf_counter() - began, torch.cat(tokens, dim=1), queued


def torch_generate(model: Any, prompt: Any, new: int, compiled: bool) -> tuple[float, float]:
    """(seconds to the first token, seconds for the other new tokens) with a static cache."""
    import torch

    options = {
        "do_sample": False,
        "cache_implementation": "static",
        "disable_compile": not compiled,
        "pad_token_id": 0,
    }
    mask = torch.ones_like(prompt)
    timings = []
    for count in (1, new):
        torch.cuda.synchronize()
        began = time.perf_counter()
        model.generate(
            prompt, attention_mask=mask, max_new_tokens=count, min_new_tokens=count, **options
        )
        torch.cuda.synchronize()
        timings.append(time.perf_counter() - began)
    return timings[0], timings[1] - timings[0]


def main() -> None:
    """Build, export, compile and race; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 layers, 64 new tokens")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument(
        "--exporter",
        choices=("torchscript", "dynamo"),
        default="torchscript",
        help="how the decoder is exported to ONNX",
    )
    parser.add_argument(
        "--profile", action="store_true", help="then profile knopt's host side (batch 1)"
    )
    parser.add_argument(
        "--kernels", action="store_true", help="then knopt's GPU kernels a step (batch 1)"
    )
    args = parser.parse_args()
    import torch

    layers, new = (4, 64) if args.quick else (16, 256)
    model = build(layers)
    parameters = sum(p.numel() for p in model.parameters())
    step_bound = parameters * 2 / BANDWIDTH
    print(
        f"decoder: {layers} layers, {parameters / 1e9:.3f}B parameters; weight-bandwidth "
        f"bound {step_bound * 1e3:.3f} ms/step"
    )
    with tempfile.TemporaryDirectory() as folder:
        began = time.perf_counter()
        path = export(model, Path(folder), args.exporter)
        print(f"exported in {time.perf_counter() - began:.1f} s")
        caches = {
            f"present.{i}.{kv}": f"past_key_values.{i}.{kv}"
            for i in range(layers)
            for kv in ("key", "value")
        }
        session = knopt.compile(
            path,
            "cuda",
            precision="fp16",
            dims={
                "batch": (1, 1, 8),
                "seq": (1, PROMPT, PROMPT),
                "past": (0, PROMPT, PROMPT + new),
            },
            resident=caches,
            cache_mask="attention_mask",
        )
        began = time.perf_counter()
        session.run(
            ["logits"],
            {
                "input_ids": np.ones((1, 4), np.int64),
                "attention_mask": np.ones((1, 4), np.int64),
                "position_ids": np.arange(4)[None],
            },
        )
        print(f"knopt optimized and compiled in {time.perf_counter() - began:.1f} s")
    for batch in (1, 8):
        prompt = torch.randint(0, 32000, (batch, PROMPT), device="cuda")
        cold = knopt_generate(session, prompt, new)
        first, rest, tokens, queued = knopt_generate(session, prompt, new)
        rows = {"knopt": (first, rest), "knopt (cold)": cold[:2]}
        rows["torch eager, static cache"] = torch_generate(model, prompt, new, compiled=False)
        if not args.no_compile:
            torch_generate(model, prompt, new, compiled=True)  # compiles
            rows["torch.compile decode step"] = torch_generate(model, prompt, new, compiled=True)
        print(f"\nbatch {batch}, prompt {PROMPT}, {new} new tokens (greedy, fp16)")
        header = ("first token ms", "decode tok/s", "ms/step", "of bound")
        print(f"{'':28s} {header[0]:>15s} {header[1]:>13s} {header[2]:>9s} {header[3]:>9s}")
        for name, (ttft, decode) in rows.items():
            per_step = decode / (new - 1)
            rate = batch * (new - 1) / decode
            print(
                f"{name:28s} {ttft * 1e3:15.1f} {rate:13.1f} {per_step * 1e3:9.3f} "
                f"{step_bound / per_step:9.1%}"
            )
        print(f"knopt's host time per step (queueing it): {queued / (new - 1) * 1e3:.3f} ms")
        agreement = _agreement(model, prompt, tokens)
        print(f"knopt's greedy tokens equal torch's for {agreement:.0%} of the first 16 steps")
        session.reset()
    if args.profile:
        _profile(session, new)
    if args.kernels:
        _kernels(session, new)


def _profile(session: knopt.Session, new: int) -> None:
    """Where the host's time goes in a batch-1 generation (cProfile, by own time)."""
    import cProfile
    import pstats

    import torch

    prompt = torch.randint(0, 32000, (1, PROMPT), device="cuda")
    profiler = cProfile.Profile()
    profiler.enable()
    knopt_generate(session, prompt, new)
    profiler.disable()
    print(f"\nhost profile of one batch-1 generation ({new} tokens), by own time:")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def _agreement(model: Any, prompt: Any, tokens: Any) -> float:
    """The share of knopt's first 16 greedy tokens that torch (eager, static) also picks."""
    import torch

    with torch.no_grad():
        reference = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=16,
            min_new_tokens=16,
            do_sample=False,
            cache_implementation="static",
            disable_compile=True,
            pad_token_id=0,
        )[:, PROMPT:]
    return float((reference == tokens[:, :16]).float().mean())


def _kernels(session: knopt.Session, new: int) -> None:
    """The GPU kernels of knopt's batch-1 decoding step, by name (torch's profiler).

    A generation of `new` tokens less one of a single token (the prefill alone), per step.
    Under programmatic dependent launch a kernel's time includes its wait for the one ahead:
    run with KNOPT_PDL=0 for each kernel's own time.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    prompt = torch.randint(0, 32000, (1, PROMPT), device="cuda")
    knopt_generate(session, prompt, new)  # warm
    totals = []
    for count in (1, new):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            knopt_generate(session, prompt, count)
            torch.cuda.synchronize()
        kernels: dict[str, tuple[int, float]] = {}
        for event in prof.key_averages():
            us = float(getattr(event, "self_device_time_total", 0.0))
            if us > 0:
                kernels[event.key[:70]] = (event.count, us)
        totals.append(kernels)
    steps = new - 1
    rows = []
    for name, (count, us) in totals[1].items():
        count0, us0 = totals[0].get(name, (0, 0.0))
        rows.append((name, (count - count0) / steps, (us - us0) / steps))
    rows.sort(key=lambda r: -r[2])
    total = sum(r[2] for r in rows)
    print(f"\nknopt's GPU kernels a decoding step (batch 1, mean of {steps} steps): {total:.1f} us")
    print(f"{'kernel':70s} {'launches':>9s} {'us':>8s} {'share':>6s}")
    for name, launches, step_us in rows[:30]:
        if launches > 0:
            print(f"{name:70s} {launches:9.2f} {step_us:8.1f} {step_us / total:6.1%}")


if __name__ == "__main__":
    main()
