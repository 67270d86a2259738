"""BERT-base with a dynamic batch and sequence: one knopt session for every size (GPU).

    python benchmarks/dynamic.py            # 20 sizes, fp16
    python benchmarks/dynamic.py --quick    # 5 sizes, fewer timed runs

A randomly initialised BERT-base (transformers, no download) is exported to ONNX with dynamic
batch and sequence axes, then compiled once with `dims={"batch": (1, 8, 64), "seq": (1, 128,
512)}`. For each size, in a seeded random order after the profile's opt size:

- knopt first: wall milliseconds of the first run at that size (plan, library plans, eager
  run; kernels compiled only for sizes of a new kind). cuDNN's attention plans of a size after
  the first are built in a helper process meanwhile (the attention runs knopt's kernel until
  they are in): "all plans in" is when `Session.wait_for_plans` saw them all, from the first
  run's start. Steady latency is timed after that;
- knopt steady: median wall milliseconds of a run (GPU inputs through DLPack, results left on
  the GPU), and the same for knopt's fixed-size program: the same optimized program bound to
  the size with every literal a compile-time constant (what a program made for one size runs);
- torch eager (fp16) and torch.compile(dynamic=True): first call (seconds; a recompile shows
  as a jump and is counted) and steady milliseconds.

Targets (issue #12): knopt's first run at a new size <= 50 ms after the first size, and its
steady latency within 1.15x of the fixed-size program at every size. A new size also plans its
GEMMs (a new row count each), and cuBLASLt's candidates are timed once per GEMM shape unless
`KNOPT_TUNE=0` (the choices are kept on disk, so a second run of this script times nothing);
the header says which. Needs a CUDA GPU, torch and transformers.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import knopt  # noqa: E402
from knopt.cuda.runner import CudaRunner  # noqa: E402
from knopt.ir.bind import bind_program  # noqa: E402

DIMS = {"batch": (1, 8, 64), "seq": (1, 128, 512)}
FIRST_TARGET_MS = 50.0
STEADY_TARGET = 1.15


def export_bert(folder: Path, layers: int) -> tuple[Path, Any]:
    """A random BERT-base (fp32) exported with dynamic batch and sequence."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(num_hidden_layers=layers), add_pooling_layer=False).eval()

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = model

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state

    path = folder / "bert.onnx"
    ids = torch.ones(2, 16, dtype=torch.int64)
    torch.onnx.export(
        Encoder().eval(),
        (ids, ids),
        str(path),
        input_names=["input_ids", "attention_mask"],
        output_names=["hidden"],
        dynamic_axes={n: {0: "batch", 1: "seq"} for n in ("input_ids", "attention_mask", "hidden")},
        opset_version=17,
        dynamo=False,
    )
    return path, model


def sizes(count: int) -> list[tuple[int, int]]:
    """The profile's opt size, then seeded random sizes in its range (1 included)."""
    rng = random.Random(0)
    found = [(DIMS["batch"][1], DIMS["seq"][1]), (1, 1)]
    while len(found) < count:
        pair = (rng.randint(1, DIMS["batch"][2]), rng.randint(1, DIMS["seq"][2]))
        if pair not in found:
            found.append(pair)
    found.insert(2, found.pop(1))  # (1, 1) third: after a size of the common kind
    return found[:count]


def wall_ms(run: Callable[[], Any], synchronize: Callable[[], None]) -> float:
    """Milliseconds of one call, the GPU finished."""
    synchronize()
    began = time.perf_counter()
    run()
    synchronize()
    return (time.perf_counter() - began) * 1e3


def steady_ms(run: Callable[[], Any], synchronize: Callable[[], None], repeat: int) -> float:
    """Median milliseconds of `repeat` calls after two warm-up calls."""
    for _ in range(2):
        run()
    return statistics.median(wall_ms(run, synchronize) for _ in range(repeat))


def _profiled_ms(run: Callable[[], Any], synchronize: Callable[[], None]) -> float:
    """`wall_ms` under cProfile; prints the calls that took the most time, callees included."""
    profile = cProfile.Profile()
    profile.enable()
    elapsed = wall_ms(run, synchronize)
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(18)
    print(out.getvalue().split("\n\n", 1)[-1].strip())
    return elapsed


def main() -> None:
    """Run the comparison and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 sizes, 10 timed runs each")
    parser.add_argument("--layers", type=int, default=12, help="encoder layers (BERT-base: 12)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument(
        "--profile", action="store_true", help="print where each first run's time goes (cProfile)"
    )
    args = parser.parse_args()
    import torch

    count, repeat = (5, 10) if args.quick else (20, 30)
    tuning = os.environ.get("KNOPT_TUNE", "1").strip() != "0"
    print(f"cuBLASLt timing of new GEMM shapes: {'on' if tuning else 'off (KNOPT_TUNE=0)'}")
    device = torch.device("cuda")
    with tempfile.TemporaryDirectory() as folder:
        began = time.perf_counter()
        path, model = export_bert(Path(folder), args.layers)
        print(f"exported BERT ({args.layers} layers) in {time.perf_counter() - began:.1f} s")
        began = time.perf_counter()
        session = knopt.compile(path, "cuda", precision="fp16", dims=DIMS)
        result = session.optimized
        assert result is not None
        print(f"knopt optimized in {time.perf_counter() - began:.1f} s (once for every size)")
    model = model.half().to(device)
    compiled = None if args.no_compile else torch.compile(model, dynamic=True)
    fixed = CudaRunner("fp16", lift=False)
    sync = torch.cuda.synchronize
    rows = []
    for index, (batch, seq) in enumerate(sizes(count)):
        ids = torch.randint(0, 30000, (batch, seq), device=device)
        mask = torch.ones(batch, seq, dtype=torch.int64, device=device)
        feeds = {"input_ids": ids, "attention_mask": mask}
        row: dict[str, Any] = {"batch": batch, "seq": seq}

        def knopt_run(feeds: dict[str, Any] = feeds) -> Any:
            return session.run(None, feeds, device_outputs=True)

        began = time.perf_counter()
        if args.profile and index:
            row["first_ms"] = _profiled_ms(knopt_run, sync)
        else:
            row["first_ms"] = wall_ms(knopt_run, sync)
        session.wait_for_plans()  # cuDNN's attention plans built in the background
        row["ready_ms"] = (time.perf_counter() - began) * 1e3
        row["steady_ms"] = steady_ms(knopt_run, sync, repeat)
        ours = torch.as_tensor(knopt_run()[0], device=device).float()
        executable = fixed.executable(bind_program(result.program, {"batch": batch, "seq": seq}))
        fixed.wait_for_plans()

        def fixed_run(feeds: dict[str, Any] = feeds, executable: Any = executable) -> Any:
            return executable.run(feeds, device_outputs=True)

        row["fixed_ms"] = steady_ms(fixed_run, sync, repeat)
        theirs = torch.as_tensor(fixed_run()[0], device=device).float()
        with torch.no_grad():

            def eager(ids: Any = ids, mask: Any = mask) -> Any:
                return model(input_ids=ids, attention_mask=mask).last_hidden_state

            row["eager_ms"] = steady_ms(eager, sync, repeat)
            reference = eager().float()
            if compiled is not None:

                def compiled_run(ids: Any = ids, mask: Any = mask) -> Any:
                    return compiled(input_ids=ids, attention_mask=mask).last_hidden_state

                row["compile_first_s"] = wall_ms(compiled_run, sync) / 1e3
                row["compile_ms"] = steady_ms(compiled_run, sync, repeat)
        row["ratio"] = row["steady_ms"] / row["fixed_ms"]
        row["err_fixed"] = float((ours - theirs).abs().max())
        row["err_torch"] = float((ours - reference).abs().max())
        rows.append(row)
        print(_line(row, index), flush=True)
    _summary(rows)


def _line(row: dict[str, Any], index: int) -> str:
    compile_part = (
        f"{row['compile_first_s']:8.2f} s {row['compile_ms']:8.3f}" if "compile_ms" in row else ""
    )
    return (
        f"{index:3d} {row['batch']:4d} x {row['seq']:4d} | knopt first {row['first_ms']:8.1f} ms"
        f" (all plans in {row['ready_ms']:7.1f} ms) steady {row['steady_ms']:7.3f}"
        f" | fixed {row['fixed_ms']:7.3f} ({row['ratio']:.3f}x)"
        f" | eager {row['eager_ms']:7.3f} | compile {compile_part}"
        f" | max err vs fixed {row['err_fixed']:.2e}, vs torch {row['err_torch']:.2e}"
    )


def _summary(rows: list[dict[str, Any]]) -> None:
    later = [r["first_ms"] for r in rows[1:]]
    worst = max(r["ratio"] for r in rows)
    print(
        f"\nfirst run at a new size after the first: max {max(later):.1f} ms, median "
        f"{statistics.median(later):.1f} ms (target <= {FIRST_TARGET_MS:.0f} ms: "
        f"{'met' if max(later) <= FIRST_TARGET_MS else 'missed'})"
    )
    print(
        f"steady latency against the fixed-size program: worst {worst:.3f}x, median "
        f"{statistics.median(r['ratio'] for r in rows):.3f}x (target <= {STEADY_TARGET}x: "
        f"{'met' if worst <= STEADY_TARGET else 'missed'})"
    )
    if "compile_first_s" in rows[0]:
        recompiles = sum(r["compile_first_s"] > 1.0 for r in rows[1:])
        print(f"torch.compile(dynamic=True): {recompiles} of {len(rows) - 1} new sizes recompiled")


if __name__ == "__main__":
    main()
