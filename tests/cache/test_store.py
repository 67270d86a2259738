"""The program cache: written once, read by others, ignored when its key does not match."""

from __future__ import annotations

import multiprocessing
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import knopt
from knopt.cache import ProgramCache, cache_key, device_fingerprint, knopt_build
from knopt.cache import key as key_module
from knopt.cache import store as store_module
from knopt.ir.bind import bind_symbols
from knopt.ir.graph import Graph
from knopt.ir.text import format_graph
from knopt.opt.cost import find_profile
from knopt.opt.optimize import OptimizeResult
from tests.models import MODELS

CPU = find_profile("cpu")


def _mlp(batch: int = 2) -> Graph:
    return bind_symbols(knopt.load(MODELS / "mlp_ts14.onnx"), {"batch": batch})


def _optimize(cache: ProgramCache, graph: Graph) -> OptimizeResult:
    return cache.optimize(graph, CPU, device="cpu", precision="f32")


def test_second_cache_reads_the_program_the_first_wrote(tmp_path: Path) -> None:
    graph = _mlp()
    first = _optimize(ProgramCache(tmp_path), graph)
    reader = ProgramCache(tmp_path)
    again = _optimize(reader, graph)
    assert (reader.stats.hits, reader.stats.writes) == (1, 0)
    assert format_graph(again.graph) == format_graph(first.graph)
    assert again.program.kernels == first.program.kernels
    assert again.program.tensors == first.program.tensors
    assert again.report.to_json() == first.report.to_json()


def test_sessions_share_the_cache_and_agree(tmp_path: Path, rng: np.random.Generator) -> None:
    x = rng.standard_normal((3, 16)).astype(np.float32)
    path = MODELS / "mlp_ts14.onnx"
    writer = knopt.compile(path, optimize=True, cache=tmp_path)
    (expected,) = writer.run(None, {"input": x})
    reader = knopt.compile(path, optimize=True, cache=tmp_path)
    (got,) = reader.run(None, {"input": x})
    assert writer.cache is not None and reader.cache is not None
    assert (writer.cache.stats.writes, reader.cache.stats.hits) == (1, 1)
    np.testing.assert_array_equal(got, expected)
    (reference,) = knopt.compile(path).run(None, {"input": x})
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-6)


def test_entry_of_another_knopt_build_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph = _mlp()
    monkeypatch.setattr(key_module, "knopt_build", lambda: "0.0.1+older")
    old = ProgramCache(tmp_path)
    _optimize(old, graph)
    old_path = old.path(cache_key(graph, CPU, "cpu", "f32"))
    monkeypatch.undo()
    current = ProgramCache(tmp_path)
    new_path = current.path(cache_key(graph, CPU, "cpu", "f32"))
    assert new_path != old_path
    _optimize(current, graph)
    assert (current.stats.hits, current.stats.writes) == (0, 1)
    # Even under the current key's file name, an entry that says it is another build is unused.
    shutil.copyfile(old_path, new_path)
    renamed = ProgramCache(tmp_path)
    _optimize(renamed, graph)
    assert (renamed.stats.hits, renamed.stats.ignored, renamed.stats.writes) == (0, 1, 1)
    assert _optimize(ProgramCache(tmp_path), graph) is not None


def test_entry_of_another_gpu_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = _mlp()
    fingerprints = {"cuda": "cuda:NVIDIA H100|sm_90|driver 12080|nvrtc 12.8"}
    monkeypatch.setattr(store_module, "device_fingerprint", lambda device: fingerprints[device])
    h100 = ProgramCache(tmp_path)
    h100.optimize(graph, CPU, device="cuda", precision="fp16")
    h100_path = h100.path(cache_key(graph, CPU, fingerprints["cuda"], "fp16"))
    fingerprints["cuda"] = "cuda:NVIDIA H200|sm_90|driver 13000|nvrtc 13.0"
    h200 = ProgramCache(tmp_path)
    h200.optimize(graph, CPU, device="cuda", precision="fp16")
    assert (h200.stats.hits, h200.stats.writes) == (0, 1)
    shutil.copyfile(h100_path, h200.path(cache_key(graph, CPU, fingerprints["cuda"], "fp16")))
    again = ProgramCache(tmp_path)
    again.optimize(graph, CPU, device="cuda", precision="fp16")
    assert (again.stats.hits, again.stats.ignored) == (0, 1)


def test_entry_of_another_model_or_precision_is_ignored(tmp_path: Path) -> None:
    two, four = _mlp(2), _mlp(4)
    cache = ProgramCache(tmp_path)
    _optimize(cache, two)
    shutil.copyfile(
        cache.path(cache_key(two, CPU, "cpu", "f32")),
        cache.path(cache_key(four, CPU, "cpu", "f32")),
    )
    shutil.copyfile(
        cache.path(cache_key(two, CPU, "cpu", "f32")),
        cache.path(cache_key(two, CPU, "cpu", "bf16")),
    )
    other = ProgramCache(tmp_path)
    result = _optimize(other, four)
    other.optimize(two, CPU, device="cpu", precision="bf16")
    assert (other.stats.hits, other.stats.ignored, other.stats.writes) == (0, 2, 2)
    assert result.graph.inputs[0].shape == (4, 16)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "pickle"])
def test_damaged_entry_is_ignored_and_replaced(tmp_path: Path, damage: str) -> None:
    graph = _mlp()
    cache = ProgramCache(tmp_path)
    _optimize(cache, graph)
    path = cache.path(cache_key(graph, CPU, "cpu", "f32"))
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:200])
    elif damage == "garbage":
        path.write_bytes(b"not a zip file")
    else:
        # A pickled object array where the header should be: never unpickled, so unused.
        with path.open("wb") as file:
            np.savez(file, header=np.array([{"format": 1}], dtype=object))
    again = ProgramCache(tmp_path)
    _optimize(again, graph)
    assert (again.stats.hits, again.stats.ignored, again.stats.writes) == (0, 1, 1)
    reread = ProgramCache(tmp_path)
    _optimize(reread, graph)
    assert reread.stats.hits == 1


def _optimize_in_child(directory: str) -> tuple[int, int]:
    cache = ProgramCache(directory)
    _optimize(cache, _mlp())
    return cache.stats.hits, cache.stats.writes


def test_two_processes_at_once_optimize_once(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        results = pool.map(_optimize_in_child, [str(tmp_path), str(tmp_path)])
    assert sorted(results) == [(0, 1), (1, 0)]
    assert len(list((tmp_path / "programs").glob("*.npz"))) == 1
    assert not list((tmp_path / "programs").glob("*.tmp"))


def test_key_names_knopt_build_and_device() -> None:
    assert knopt_build().startswith(knopt.__version__ + "+")
    assert device_fingerprint("cpu") == "cpu"
    key = cache_key(_mlp(), CPU, "cpu", "f32")
    assert key.name != cache_key(_mlp(), CPU, "cpu", "fp16").name
    assert key.name != cache_key(_mlp(), find_profile("h200"), "cpu", "f32").name


def test_cuda_session_keeps_cubins_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path / "elsewhere"))  # restored after
    cache = store_module.open_cache(tmp_path, "cuda")
    assert Path(os.environ["KNOPT_CACHE_DIR"]) == cache.cubin_dir
