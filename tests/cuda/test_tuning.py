"""The tuning cache and the candidate timer (no GPU: a fake timer stands in for the stream)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from knopt.cuda import tuning
from knopt.errors import CudaError


def test_choices_survive_a_new_process(tmp_path: Path) -> None:
    path = tuning.cache_file(tmp_path, "cublaslt", 130100, "NVIDIA H200")
    tuning.TuningCache(path).put("m1 n2", {"index": 3, "algo": "ab"})
    assert path == tmp_path / "tuning" / "cublaslt-130100-nvidia-h200.json"
    assert tuning.TuningCache(path).get("m1 n2") == {"index": 3, "algo": "ab"}
    assert tuning.TuningCache(path).get("m9") is None
    assert list(path.parent.iterdir()) == [path]  # the temporary file was renamed, not left


def test_entries_other_processes_wrote_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    first, second = tuning.TuningCache(path), tuning.TuningCache(path)
    first.put("a", {"index": 0})
    second.put("b", {"index": 1})
    entries = json.loads(path.read_text())["entries"]
    assert entries == {"a": {"index": 0}, "b": {"index": 1}}


@pytest.mark.parametrize("text", ["{", "[]", '{"format": 99, "entries": {"a": {}}}', ""])
def test_an_unreadable_file_counts_as_empty_and_is_rewritten(tmp_path: Path, text: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(text)
    cache = tuning.TuningCache(path)
    assert cache.get("a") is None
    cache.put("a", {"index": 2})
    assert tuning.TuningCache(path).get("a") == {"index": 2}


def test_tuning_is_on_unless_the_variable_says_0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tuning.TUNE_ENV, raising=False)
    assert tuning.tuning_enabled()
    monkeypatch.setenv(tuning.TUNE_ENV, "0")
    assert not tuning.tuning_enabled()
    monkeypatch.setenv(tuning.TUNE_ENV, "1")
    assert tuning.tuning_enabled()


class FakeGpu:
    """A stream whose clock advances by what each queued call costs."""

    def __init__(self) -> None:
        self.clock = 0.0
        self.capturing: list[Any] | None = None
        self.graphs = 0

    def run(self, seconds: float) -> None:
        if self.capturing is not None:
            self.capturing.append(seconds)
        else:
            self.clock += seconds

    def event(self) -> float:
        return self.clock

    def elapsed_ms(self, start: float, end: float) -> float:
        return (end - start) * 1e3

    def sync(self) -> None:
        pass

    def begin_capture(self) -> None:
        self.capturing = []

    def end_capture(self) -> list[float]:
        graph, self.capturing = self.capturing, None
        self.graphs += 1
        assert graph is not None
        return graph

    def abort_capture(self) -> None:
        self.capturing = None

    def replay(self, graph: list[float]) -> None:
        self.clock += sum(graph)

    def release_graph(self, graph: list[float]) -> None:
        self.graphs -= 1


def test_the_fastest_candidate_wins_and_a_failing_one_is_ruled_out() -> None:
    gpu = FakeGpu()

    def costing(seconds: float) -> Any:
        return lambda: gpu.run(seconds)

    def failing() -> None:
        raise CudaError("cublasLt.matmul", "NOT_SUPPORTED", "")

    times = tuning.time_candidates(gpu, [costing(3e-5), failing, costing(1e-5), costing(2e-4)])
    assert times[1] == math.inf
    assert times[0] == pytest.approx(3e-5) and times[2] == pytest.approx(1e-5)
    assert times[3] == pytest.approx(2e-4)
    assert tuning.fastest(times) == 2
    assert gpu.graphs == 0  # every timing graph was released


def test_no_runnable_candidate_is_an_error() -> None:
    with pytest.raises(CudaError, match="every candidate"):
        tuning.fastest([math.inf, math.inf])


def test_keys_are_stable_text() -> None:
    assert tuning.key_text("a[1, 2]", 3, "f16") == "a[1, 2] 3 f16"
