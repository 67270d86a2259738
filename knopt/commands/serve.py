"""`knopt serve`: serve a model over HTTP with Ray Serve, locally or on a Ray cluster."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from knopt.errors import KnoptError

APP_NAME = "knopt"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `serve` subcommand."""
    parser = subparsers.add_parser(
        "serve",
        help="serve a model over HTTP with dynamic batching (Ray Serve)",
        description="Serve MODEL over HTTP until interrupted: POST JSON or .npz inputs to the "
        "route, GET it for the model's inputs and outputs. Starts a local Ray instance, or "
        "joins the cluster given by --address (or $RAY_ADDRESS). Needs knopt[serve].",
    )
    parser.add_argument("model", type=Path, help="the .onnx file")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    parser.add_argument("--route", default="/", help="route prefix (default: /)")
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda", "best"],
        default="best",
        help="cuda (one GPU per replica), cpu, or best: cuda when a GPU is usable here",
    )
    parser.add_argument(
        "--precision",
        choices=["f32", "tf32", "fp16", "bf16"],
        default="f32",
        help="on cuda: strict f32 (default), tf32, fp16 or bf16",
    )
    parser.add_argument(
        "--replicas",
        default="auto",
        help="number of model replicas, or auto (one per GPU; on cpu, autoscaled)",
    )
    parser.add_argument(
        "--max-batch-size", type=int, default=32, help="most rows per run (default: 32)"
    )
    parser.add_argument(
        "--batch-wait-ms",
        type=float,
        default=2.0,
        help="how long a replica waits for a batch to fill (default: 2)",
    )
    parser.add_argument(
        "--cache",
        default="~/.cache/knopt",
        metavar="DIR",
        help="compiled programs shared by replicas (default: ~/.cache/knopt on each node)",
    )
    parser.add_argument("--address", help="a Ray cluster to join, such as auto or HOST:6379")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Start serving and block until interrupted."""
    from ray import serve

    url = start(args)
    print(f"serving {args.model} at {url} (Ctrl-C to stop)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.delete(APP_NAME)
    return 0


def start(args: argparse.Namespace) -> str:
    """Deploy the model on Ray Serve (connecting to Ray first if needed); returns its URL.

    Raises:
        KnoptError: If Ray Serve is missing or an argument is invalid.
    """
    try:
        import ray
        from ray import serve
    except ImportError as err:
        raise KnoptError(f"serving needs Ray Serve ({err}): pip install 'knopt[serve]'") from err
    import knopt.serve

    device = args.device
    if device == "best":
        import knopt.cuda

        device = "cuda" if knopt.cuda.is_available() else "cpu"
    replicas: int | str = int(args.replicas) if args.replicas.isdigit() else args.replicas
    if not ray.is_initialized():
        ray.init(address=args.address)
    app = knopt.serve.deployment(
        args.model,
        device=device,
        precision=args.precision,
        max_batch_size=args.max_batch_size,
        batch_wait_timeout_s=args.batch_wait_ms / 1000,
        num_replicas=replicas,
        cache=args.cache,
    )
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(app, name=APP_NAME, route_prefix=args.route)
    return f"http://{args.host}:{args.port}{args.route}"
