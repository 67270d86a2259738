"""`knopt calibrate` and device profiles read from files."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

import knopt
from knopt.calibrate import Calibration, Sample, calibrate, fit_peak
from knopt.cli import main
from knopt.errors import KnoptError
from knopt.opt.cost import CPU, find_profile, load_profile
from tests.models import fixtures
from tests.oracle import assert_same

MLP = next(f for f in fixtures() if f.file == "mlp_ts14.onnx")


@pytest.fixture(scope="module")
def measured() -> Calibration:
    return calibrate("cpu", name="here", quick=True)


def test_every_figure_is_measured_finite_and_in_a_plausible_range(measured: Calibration) -> None:
    profile = measured.profile
    assert profile.name == "here"
    # A laptop to a large server: numpy's Add moves 0.1-1000 GB/s, BLAS gives 0.1-10000 GFLOP/s.
    assert 1e8 < profile.bandwidth < 1e12
    for kind in ("f32", "f64"):
        assert 1e8 < profile.peak[kind] < 1e13, kind
    assert 0 < profile.peak["f16"] < 1e13
    assert 1e-8 < profile.launch < 1e-3
    assert all(math.isfinite(v) for v in profile.peak.values())
    # The integer rates are not measured: kept from the profile calibration starts from.
    assert profile.peak["int"] == CPU.peak["int"]
    assert profile.peak["i8"] == CPU.peak["i8"]
    assert profile.per_op_launch and measured.base is CPU
    topics = [line.split(":")[0] for line in measured.notes]
    assert topics == ["bandwidth", "peak f32", "peak f64", "peak f16", "launch", "peak int"]
    assert [s.kind for s in measured.samples] == ["", "f32", "f64", "f16"]


def test_the_fitted_peak_is_the_one_that_made_the_samples() -> None:
    bandwidth, launch, peak = 4e12, 1e-6, 400e12

    def sample(m: int, n: int, k: int) -> Sample:
        flops, nbytes = 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n)
        return Sample("gemm", "f16", flops, nbytes, launch + max(nbytes / bandwidth, flops / peak))

    samples = [sample(128, 768, 768), sample(4096, 3072, 768), sample(8192, 8192, 8192)]
    assert fit_peak(samples, bandwidth, launch) == pytest.approx(peak, rel=0.02)
    # Kernels slower than the roofline at some sizes pull the fitted peak down.
    slower = [dataclasses.replace(s, seconds=s.seconds * 1.5) for s in samples]
    assert fit_peak(slower, bandwidth, launch) < peak


def test_profile_file_round_trips(measured: Calibration, tmp_path: Path) -> None:
    path = tmp_path / "here.json"
    path.write_text(json.dumps(measured.to_json()))
    assert json.loads(path.read_text())["samples"][0]["what"].startswith("add")
    assert load_profile(path) == measured.profile
    assert find_profile(str(path)) == measured.profile
    assert find_profile(path) == measured.profile


def test_optimize_uses_the_calibrated_profile(measured: Calibration, tmp_path: Path) -> None:
    path = tmp_path / "here.json"
    path.write_text(json.dumps(measured.profile.to_json()))
    graph = knopt.load(MLP.path)
    result = knopt.optimize(graph, profile=path, ilp=False)
    assert result.report.profile == "here"
    feeds = MLP.feeds()
    assert_same(knopt.compile(result.graph).run(None, feeds), knopt.compile(graph).run(None, feeds))
    # The estimate is in the profile's units: a device a thousand times slower in bandwidth,
    # arithmetic and launch takes a thousand times longer for the same program.
    slow = dataclasses.replace(
        measured.profile,
        bandwidth=measured.profile.bandwidth / 1000,
        peak={k: v / 1000 for k, v in measured.profile.peak.items()},
        launch=measured.profile.launch * 1000,
    )
    assert knopt.optimize(graph, profile=slow, ilp=False).report.cost_after > (
        100 * result.report.cost_after
    )


def test_session_optimizes_with_the_given_profile(measured: Calibration) -> None:
    session = knopt.compile(MLP.path, optimize=True, profile=measured.profile)
    feeds = MLP.feeds()
    assert_same(session.run(None, feeds), knopt.compile(MLP.path).run(None, feeds))
    assert session.profile == measured.profile


def test_session_rejects_a_bad_profile_when_made() -> None:
    with pytest.raises(KnoptError, match="unknown device profile 'fast'"):
        knopt.compile(MLP.path, optimize=True, profile="fast")


GOOD = {"name": "x", "bandwidth": 1e10, "peak": dict(CPU.peak), "launch": 1e-6}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({**GOOD, "peak": {"f32": 1.0}}), "'peak' must give FLOP/s"),
        (json.dumps({**GOOD, "bandwidth": -1}), "'bandwidth' must be a positive number"),
        (json.dumps({**GOOD, "launch": True}), "'launch' must be a positive number"),
        (json.dumps({**GOOD, "peak": {**CPU.peak, "f16": "fast"}}), "'peak.f16' must be"),
        (json.dumps({**GOOD, "name": ""}), "'name' must be a non-empty string"),
        (json.dumps({**GOOD, "symbol_size": 0}), "'symbol_size' must be a positive integer"),
    ],
)
def test_bad_profile_file_names_the_file_and_the_field(
    text: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(KnoptError, match=message) as caught:
        load_profile(path)
    assert str(path) in str(caught.value)


def test_infinite_rate_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "inf.json"
    path.write_text(json.dumps({**GOOD, "bandwidth": 1e400}).replace("1e400", "Infinity"))
    with pytest.raises(KnoptError, match="'bandwidth' must be finite"):
        load_profile(path)


def test_missing_profile_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(KnoptError, match="cannot read it"):
        find_profile(tmp_path / "none.json")


def test_unknown_device_is_refused() -> None:
    with pytest.raises(KnoptError, match="cannot calibrate device 'tpu'"):
        calibrate("tpu")


def test_cuda_without_a_gpu_is_a_clear_error() -> None:
    import knopt.cuda

    if knopt.cuda.is_available():
        pytest.skip("a GPU is present (tests/cuda/test_calibrate.py covers it)")
    with pytest.raises(KnoptError, match="cannot calibrate 'cuda'"):
        calibrate("cuda", quick=True)


def test_cli_writes_a_profile_that_optimize_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cpu.json"
    assert main(["calibrate", "--quick", "-o", str(path), "--name", "mine"]) == 0
    err = capsys.readouterr().err
    assert "bandwidth:" in err and "against the built-in 'cpu' estimates" in err
    assert load_profile(path).name == "mine"
    assert len(json.loads(path.read_text())["samples"]) == 4
    out = tmp_path / "mlp.onnx"
    args = ["optimize", str(MLP.path), "--device-profile", str(path), "-o", str(out)]
    assert main(args) == 0
    assert "(mine)" in capsys.readouterr().err
    assert out.exists()


def test_cli_prints_the_profile_without_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--quick"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["name"] == "cpu-calibrated" and printed["bandwidth"] > 0


def test_cli_unknown_profile_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["optimize", str(MLP.path), "--device-profile", "fast"]) == 1
    assert "unknown device profile 'fast'" in capsys.readouterr().err
