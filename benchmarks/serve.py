"""Serving throughput and latency: knopt.serve (dynamic batching) against a per-request loop.

At each concurrency level, that many clients send one-row requests back to back for a fixed
time; the table gives requests per second and the median and 99th-percentile latency. The
baseline is the same compiled model behind a plain loop that calls `session.run` once per
request in one thread (what a server without batching does); "serve, batch 1" is knopt.serve
with batching off, which isolates Ray Serve's own overhead from batching's gain.

    python benchmarks/serve.py                       # CPU: the BERT fixture (sequence 12)
    python benchmarks/serve.py --device cuda         # BERT-base fp16, sequence 128, one
                                                     # replica per GPU (needs torch, transformers)

Programs are compiled ahead of time into --cache for batch sizes 1, 2, 4, ... up to the largest
batch, so no timed request waits for the optimizer.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

import knopt
from knopt.serve import ModelSpec, deployment

ROOT = Path(__file__).parents[1]
CPU_MODEL = ROOT / "tests" / "fixtures" / "models" / "bert_ts14.onnx"
CPU_SEQ = 12
CPU_VOCAB = 100  # the fixture's vocabulary (tests/fixtures/models/manifest.json)
GPU_SEQ = 128
GPU_VOCAB = 30000

Ask = Callable[[dict[str, np.ndarray]], Awaitable[Any]]


def feeds_for(model: Path, seq: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
    """One-row inputs: token ids, and an all-ones attention mask if the model takes one."""
    rng = np.random.default_rng(seed)
    spec = ModelSpec.of(knopt.compile(model))
    feeds = {}
    for tensor in spec.inputs:
        if tensor.name == "attention_mask":
            feeds[tensor.name] = np.ones((1, seq), np.int64)
        else:
            feeds[tensor.name] = rng.integers(1, vocab, (1, seq)).astype(np.int64)
    return feeds


async def load(ask: Ask, feeds: dict[str, np.ndarray], clients: int, seconds: float) -> dict:
    """Requests per second and latency percentiles of `clients` back-to-back clients."""
    latencies: list[float] = []
    stop = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < stop:
            began = time.perf_counter()
            await ask(feeds)
            latencies.append(time.perf_counter() - began)

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - began
    ordered = sorted(latencies)
    return {
        "rps": len(ordered) / elapsed,
        "p50_ms": 1000 * statistics.median(ordered),
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    }


def loop_server(model: Path, device: str, precision: str, cache: str) -> Ask:
    """The baseline: one thread running `session.run` per request, in arrival order."""
    session = knopt.compile(model, device, precision=precision, optimize=True, cache=cache)
    worker = ThreadPoolExecutor(1)

    async def ask(feeds: dict[str, np.ndarray]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(worker, session.run, None, feeds)

    return ask


def serve_server(model: Path, args: argparse.Namespace, max_batch_size: int, name: str) -> Ask:
    """knopt.serve's handle (the Python client; HTTP adds its own cost on top)."""
    from ray import serve

    app = deployment(
        model,
        device=args.device,
        precision=args.precision,
        max_batch_size=max_batch_size,
        batch_wait_timeout_s=args.batch_wait_ms / 1000,
        num_replicas=args.replicas if args.replicas == "auto" else int(args.replicas),
        cache=args.cache,
    )
    handle = serve.run(app, name=name, route_prefix=f"/{name}")

    async def ask(feeds: dict[str, np.ndarray]) -> Any:
        return await handle.run.remote(feeds)

    return ask


def precompile(model: Path, args: argparse.Namespace, dims: list[str]) -> None:
    """`knopt compile` every batch size the batcher may pad to (powers of two) into the cache."""
    sizes = ",".join(str(1 << i) for i in range(args.max_batch_size.bit_length()))
    command = [sys.executable, "-m", "knopt.cli", "compile", str(model), "--cache", args.cache]
    command += ["--device", args.device, "--precision", args.precision]
    command += ["--dims", f"batch={sizes}", *(f"--dims={d}" for d in dims)]
    subprocess.run(command, check=True)


def export_bert_base(folder: Path) -> Path:
    """BERT-base (random weights) exported with a dynamic batch axis and sequence 128."""
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from gpu import build

    model = build("bert", "eager")
    path = folder / "bert-base.onnx"
    torch.onnx.export(
        model,
        (torch.ones((1, GPU_SEQ), dtype=torch.int64),),
        str(path),
        input_names=["input_ids"],
        output_names=["output"],
        dynamic_axes={"input_ids": {0: "batch"}, "output": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    return path


async def measure(args: argparse.Namespace, model: Path, seq: int) -> list[dict]:
    """Every server at every concurrency level, one server at a time (they share the GPUs)."""
    from ray import serve

    vocab = GPU_VOCAB if args.device == "cuda" else CPU_VOCAB
    feeds = feeds_for(model, seq, vocab, seed=0)
    servers: dict[str, Callable[[], Ask]] = {
        "session.run loop": lambda: loop_server(model, args.device, args.precision, args.cache),
        "serve, batch 1": lambda: serve_server(model, args, 1, "unbatched"),
        f"serve, batch {args.max_batch_size}": lambda: serve_server(
            model, args, args.max_batch_size, "batched"
        ),
    }
    rows = []
    for name, start in servers.items():
        ask = start()
        for clients in args.concurrency:
            await load(ask, feeds, clients, args.warmup)
            result = await load(ask, feeds, clients, args.seconds)
            rows.append({"server": name, "clients": clients, **result})
            print(
                f"{name:>20}  clients {clients:3d}: {result['rps']:8.1f} req/s  "
                f"p50 {result['p50_ms']:7.2f} ms  p99 {result['p99_ms']:7.2f} ms",
                flush=True,
            )
        for app in serve.status().applications:
            serve.delete(app)
    return sorted(rows, key=lambda row: row["clients"])


def table(rows: list[dict]) -> str:
    """The results as a Markdown table."""
    lines = [
        "| server | clients | req/s | p50 ms | p99 ms |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['server']} | {r['clients']} | {r['rps']:.1f} | {r['p50_ms']:.2f} | "
        f"{r['p99_ms']:.2f} |"
        for r in rows
    ]
    return "\n".join(lines)


def main() -> None:
    """Compile, start the servers, measure, print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", default=None, help="default: f32 on cpu, fp16 on cuda")
    parser.add_argument("--replicas", default=None, help="default: 1 on cpu, auto on cuda")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--batch-wait-ms", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=4.0, help="timed load per level")
    parser.add_argument("--warmup", type=float, default=1.0, help="untimed load per level")
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "knopt-bench"))
    args = parser.parse_args()
    cuda = args.device == "cuda"
    args.precision = args.precision or ("fp16" if cuda else "f32")
    args.replicas = args.replicas or ("auto" if cuda else "1")

    import ray

    with tempfile.TemporaryDirectory() as folder:
        model = export_bert_base(Path(folder)) if cuda else CPU_MODEL
        seq = GPU_SEQ if cuda else CPU_SEQ
        precompile(model, args, [] if cuda else [f"seq={seq}"])
        ray.init(include_dashboard=False, num_cpus=None if cuda else 2)
        rows = asyncio.run(measure(args, model, seq))
        print(f"\n### {date.today()}: {model.name} on {args.device} ({args.precision})\n")
        print(
            f"Machine: {platform.platform()}, os.cpu_count() = {os.cpu_count()}; Python "
            f"{platform.python_version()}, numpy {np.__version__}, ray {ray.__version__}. "
            f"One-row requests through the handle; {args.replicas} replica(s); batch wait "
            f"{args.batch_wait_ms} ms; {args.seconds} s per level after {args.warmup} s.\n"
        )
        print(table(rows))


if __name__ == "__main__":
    main()
