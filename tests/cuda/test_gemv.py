"""knopt's GEMV (codegen/gemv.cu, knopt/cuda/gen/gemv.py): which GEMMs it takes, on the CPU;
on the GPU, every column count and split against numpy, weights loaded while the kernel ahead
still writes the activations, and whole programs against the CPU oracle."""

from __future__ import annotations

import numpy as np
import pytest

import knopt
from knopt.cuda.gen import gemv
from knopt.cuda.planner import build_plan
from knopt.cuda.precision import narrow_program
from knopt.cuda.steps import Gemm, Launch
from knopt.ir import Graph, GraphBuilder, Value
from knopt.ir.dtype import DType
from knopt.ir.program import Program
from tests.cuda.programs import compare, loaded_nvrtc, slow_copy_kernel
from tests.models import MODELS
from tests.rules.helpers import graph_of, random_feeds

F32 = DType.F32


def _linear(
    m: int, k: int, n: int, *, bias: bool = False, residual: bool = False, weight_input=False
) -> Graph:
    """y = x @ W (+ b) (+ r): W a constant unless `weight_input`."""
    rng = np.random.default_rng(m * 131 + k * 7 + n)

    def build(g: GraphBuilder) -> Value:
        x = g.input("x", (m, k), F32)
        if weight_input:
            w = g.input("w", (k, n), F32)
        else:
            w = g.constant(rng.uniform(-0.5, 0.5, (k, n)).astype(np.float32))
        y = g.matmul(x, w)
        if bias:
            y = g.add(y, g.constant(rng.uniform(-1, 1, (n,)).astype(np.float32)))
        if residual:
            y = g.add(y, g.input("r", (m, n), F32))
        return y

    return graph_of(build)


def _optimized(graph: Graph) -> Program:
    return knopt.optimize(graph, profile="h200-graph", ilp=False).program


def _steps(program: Program, precision: str = "fp16") -> tuple[list[Launch], list[Gemm]]:
    dtype = DType.F16 if precision == "fp16" else DType.BF16
    plan = build_plan(narrow_program(program, dtype), precision)
    launches = [s for s in plan.steps if isinstance(s, Launch) and s.name.startswith("kn_gemv")]
    return launches, [s for s in plan.steps if isinstance(s, Gemm)]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_few_rows_by_a_weight_take_the_gemv_with_bias_and_residual(precision: str) -> None:
    program = _optimized(_linear(gemv.MAX_ROWS, 256, 136, bias=True, residual=True))
    launches, gemms = _steps(program, precision)
    assert len(launches) == 1 and not gemms
    (launch,) = launches
    assert launch.grid == (3, gemv.split_for(136, 256), 1)  # 136 columns: 3 tiles of 64
    assert "__half" in launch.source if precision == "fp16" else "__nv_bfloat16" in launch.source
    assert "KN_PDL_OPEN(true)" in launch.source  # the weight is loaded before the wait
    bias, residual = launch.args[2], launch.args[3]
    assert not isinstance(bias, np.generic) and not isinstance(residual, np.generic)


@pytest.mark.parametrize(
    ("why", "graph", "precision"),
    [
        ("more rows than MAX_ROWS", _linear(gemv.MAX_ROWS + 1, 256, 128), "fp16"),
        ("a computed weight", _linear(1, 256, 128, weight_input=True), "fp16"),
        ("strict f32", _linear(1, 256, 128), "f32"),
        ("K not a multiple of 8", _linear(1, 250, 128), "fp16"),
        ("N not a multiple of 8", _linear(1, 256, 130), "fp16"),
    ],
)
def test_other_gemms_stay_on_cublaslt(why: str, graph: Graph, precision: str) -> None:
    program = _optimized(graph)
    if precision == "f32":
        plan = build_plan(program, "f32")
        launches = [s for s in plan.steps if isinstance(s, Launch) and "gemv" in s.name]
        gemms = [s for s in plan.steps if isinstance(s, Gemm)]
    else:
        launches, gemms = _steps(program)
    assert not launches and len(gemms) == 1, why


def test_knopt_gemv_0_keeps_cublaslt(monkeypatch: pytest.MonkeyPatch) -> None:
    program = _optimized(_linear(1, 256, 128))
    assert _steps(program)[0]
    monkeypatch.setenv(gemv.ENV, "0")
    launches, gemms = _steps(program)
    assert not launches and len(gemms) == 1


def test_the_split_fills_the_gpu_where_k_allows() -> None:
    assert gemv.split_for(2048, 2048) == 4  # 32 tiles: 128 blocks
    assert gemv.split_for(6144, 2048) == 2  # 96 tiles: 192 blocks
    assert gemv.split_for(11264, 2048) == 1  # 176 tiles
    assert gemv.split_for(32000, 2048) == 1  # 500 tiles
    assert gemv.split_for(768, 768) == 2  # 96 chunks of 8 rows: 3 k-lanes' rounds at most
    assert gemv.split_for(64, 200) == 1  # 25 chunks: fewer than one a k-lane of two blocks
    assert [gemv.columns(m) for m in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]


def test_every_gemv_variant_compiles_for_sm_90(tmp_path, monkeypatch) -> None:
    nvrtc = loaded_nvrtc()
    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path))
    from knopt.cuda.gen.indexing import named

    names, sources = [], []
    for dtype in (DType.F16, DType.BF16):
        for cols in (1, 2, 4, 8):
            for split in gemv.SPLITS:
                name, source = named("gemv", gemv.kernel_source(dtype, cols, split, cols != 2))
                names.append(name)
                sources.append(source)
    cubin = nvrtc.compile_cubin("\n".join(sources), "sm_90")
    assert all(name.encode() in cubin for name in names)


# ---- on the GPU ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu(gpu_available: bool):
    if not gpu_available:
        pytest.skip("no usable NVIDIA GPU")
    from knopt.cuda.driver import Gpu

    return Gpu()


def _run(gpu, dtype: DType, m: int, n: int, k: int, split: int, *, bias, residual, alpha, early):
    """One GEMV launch on random operands; returns (ours, float64 reference)."""
    import ml_dtypes

    from knopt.cuda import nvrtc
    from knopt.cuda.gen.indexing import named

    host = np.float16 if dtype is DType.F16 else ml_dtypes.bfloat16
    rng = np.random.default_rng(m * 7 + n * 3 + k + split)
    a = rng.uniform(-1, 1, (m, k)).astype(host)
    w = rng.uniform(-1, 1, (k, n)).astype(host)
    b = rng.uniform(-1, 1, n).astype(host) if bias else None
    r = rng.uniform(-1, 1, (m, n)).astype(host) if residual else None
    name, source = named("gemv", gemv.kernel_source(dtype, gemv.columns(m), split, early))
    kernel = gpu.load(nvrtc.compile_cubin(source, gpu.arch), [name])[name]

    def put(x):
        if x is None:
            return 0
        address = gpu.allocate(x.nbytes)
        gpu.upload(address, np.ascontiguousarray(x))
        return int(address)

    y = gpu.allocate(m * n * 2)
    gpu.fill(y, 0xFF, m * n * 2)
    args = (put(a), put(w), put(b), put(r), y, *map(np.int32, (m, n, k, k)), np.float32(alpha))
    gpu.launch(kernel, (-(-n // gemv.TILE), split, 1), (gemv.THREADS, 1, 1), 0, args)
    gpu.sync()
    ours = gpu.download(y, np.empty((m, n), host)).astype(np.float64)
    exact = alpha * (a.astype(np.float64) @ w.astype(np.float64))
    exact += 0 if b is None else b.astype(np.float64)
    exact += 0 if r is None else r.astype(np.float64)
    return ours, exact


@pytest.mark.cuda
@pytest.mark.parametrize("split", gemv.SPLITS)
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8])
def test_every_column_count_and_split_matches_numpy(gpu, m: int, split: int) -> None:
    # N past the last whole tile (a partial one), K not a multiple of a cluster's round of
    # chunks (some k-lanes take one chunk more than others, some none).
    for dtype, (n, k) in ((DType.F16, (200, 1000)), (DType.BF16, (72, 2056))):
        ours, exact = _run(
            gpu, dtype, m, n, k, split, bias=m % 2 == 1, residual=m > 1, alpha=0.75, early=True
        )
        ulp = 2.0**-10 if dtype is DType.F16 else 2.0**-7
        peak = float(np.abs(exact).max())
        where = f"{dtype.short} m={m} n={n} k={k} split={split}"
        np.testing.assert_allclose(ours, exact, rtol=4 * ulp, atol=4 * ulp * peak, err_msg=where)


@pytest.mark.cuda
def test_results_are_the_same_every_run_and_without_early_loads(gpu) -> None:
    first, _ = _run(gpu, DType.F16, 4, 512, 4096, 8, bias=True, residual=True, alpha=1, early=True)
    again, _ = _run(gpu, DType.F16, 4, 512, 4096, 8, bias=True, residual=True, alpha=1, early=True)
    late, _ = _run(gpu, DType.F16, 4, 512, 4096, 8, bias=True, residual=True, alpha=1, early=False)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first, late)


@pytest.mark.cuda
@pytest.mark.parametrize("split", [1, 8])
def test_an_early_gemv_reads_what_the_kernel_ahead_wrote(gpu, split: int) -> None:
    # Its weight streams in while the slow kernel ahead runs; its activations (zero until that
    # kernel copies them in) and the residual are read only after it, eagerly and in a graph.
    from knopt.cuda import nvrtc
    from knopt.cuda.gen.indexing import named

    m, n, k = 2, 2048, 2048
    copy = slow_copy_kernel(gpu)
    name, source = named("gemv", gemv.kernel_source(DType.F16, 2, split, True))
    kernel = gpu.load(nvrtc.compile_cubin(source, gpu.arch), [name])[name]
    rng = np.random.default_rng(5)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
    w = rng.uniform(-1, 1, (k, n)).astype(np.float16)
    exact = a.astype(np.float64) @ w.astype(np.float64)
    zeros = np.zeros_like(a)
    addresses = []
    for x in (zeros, a, w):
        addresses.append(int(gpu.allocate(x.nbytes)))
        gpu.upload(addresses[-1], x)
    a_dev, src, w_dev = addresses
    y = gpu.allocate(m * n * 2)
    copy_args = (a_dev, src, np.int32(a.size), np.int64(200_000))  # ~0.1 ms of spinning
    args = (a_dev, w_dev, 0, 0, y, *map(np.int32, (m, n, k, k)), np.float32(1))

    def queue() -> None:
        gpu.launch(copy, (4, 1, 1), (256, 1, 1), 0, copy_args)
        gpu.launch(kernel, (-(-n // gemv.TILE), split, 1), (gemv.THREADS, 1, 1), 0, args)

    for graph in (False, True):
        gpu.upload(a_dev, zeros)
        gpu.fill(y, 0xFF, m * n * 2)
        if graph:
            gpu.begin_capture()
            queue()
            executable = gpu.end_capture()
            gpu.replay(executable)
            gpu.sync()
            gpu.release_graph(executable)
        else:
            queue()
        gpu.sync()
        ours = gpu.download(y, np.empty((m, n), np.float16)).astype(np.float64)
        peak = float(np.abs(exact).max())
        np.testing.assert_allclose(ours, exact, rtol=2**-8, atol=2**-8 * peak, err_msg=str(graph))


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("m", [1, gemv.MAX_ROWS])
def test_programs_with_the_gemv_match_the_cpu(precision: str, m: int) -> None:
    graph = _linear(m, 512, 328, bias=True, residual=True)
    program = _optimized(graph)
    assert _steps(program, precision)[0]
    compare(program, random_feeds(graph, np.random.default_rng(m)), precision=precision)


def test_a_decoders_steps_take_the_gemv_and_its_prefill_cublaslt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The fixture decoder through a session with resident caches, on the stand-in GPU: in
    # every plan made (the sizes run and those warmed), linear layers of a few rows (decoding
    # steps) are GEMVs and longer ones (the prompt) cuBLASLt's.
    pytest.importorskip("cuda.core", reason="the cuda runner needs cuda-python (not a GPU)")
    from knopt.cuda import runner
    from tests.cuda.fake_gpu import fake_gpu

    plans = []
    build = runner.build_plan

    def spy(*args, **kwargs):
        plans.append(build(*args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(runner, "build_plan", spy)
    caches = {
        f"present.{i}.{kv}": f"past_key_values.{i}.{kv}"
        for i in range(2)
        for kv in ("key", "value")
    }
    model = MODELS.parent / "decoder" / "llama_kv_ts17.onnx"
    with fake_gpu(monkeypatch):
        session = knopt.compile(
            model,
            "cuda",
            precision="fp16",
            dims={"batch": (1, 1, 2), "seq": (1, 4, 8), "past": (0, 8, 100)},
            resident=caches,
            cache_mask="attention_mask",
        )
        ones = np.ones((1, 4), np.int64)
        feeds = {"input_ids": ones, "attention_mask": ones, "position_ids": np.arange(4)[None]}
        session.run(["logits"], feeds)
        step = {
            "input_ids": np.ones((1, 1), np.int64),
            "attention_mask": np.ones((1, 5), np.int64),
            "position_ids": np.array([[4]]),
        }
        session.run(["logits"], step)
    gemv_rows, gemm_rows = [], []
    for plan in plans:
        for item in plan.steps:
            if isinstance(item, Launch) and item.name.startswith("kn_gemv"):
                gemv_rows.append(int(item.args[5]))  # type: ignore[arg-type]
            elif isinstance(item, Gemm) and item.batch == 1:
                weight = plan.buffers[plan.tensors[item.b.tensor].buffer].region == "constant"
                gemm_rows.append(item.a.rows if weight else 0)
    assert gemv_rows and set(gemv_rows) <= set(range(1, gemv.MAX_ROWS + 1))
    assert any(rows > gemv.MAX_ROWS for rows in gemm_rows)  # the prompt's
    assert not [rows for rows in gemm_rows if 0 < rows <= gemv.MAX_ROWS]
