"""Library algorithms chosen by timing, once per problem, and remembered on disk.

cuBLASLt and cuDNN offer several algorithms (engines) for one problem and rank them with a
heuristic whose first pick is often not the fastest. knopt times the top few on the executor's
stream with CUDA events, outside any capture, keeps the fastest, and writes the choice to a JSON
file beside the NVRTC cache: one file per library, library version and GPU, one entry per
problem key. Writes go to a temporary file that is renamed over the old one, so a crash never
leaves a torn file; an unreadable file counts as empty (it is a cache) and is rewritten.

Set `KNOPT_TUNE=0` to take each heuristic's first pick without timing, reading or writing
anything (tests, or a quick start where the speed of the result does not matter).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from knopt.errors import CudaError

TUNE_ENV = "KNOPT_TUNE"
FORMAT = 1
TARGET_SECONDS = 1e-3  # device time per timed candidate: long enough for 0.5 us events
MAX_REPEATS = 50


class Timer(Protocol):
    """What timing needs of a GPU (`knopt.cuda.driver.Gpu` has it)."""

    def event(self) -> Any:
        """A timing event recorded on the stream now."""

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two recorded events."""

    def sync(self) -> None:
        """Wait for the stream."""

    def begin_capture(self) -> None:
        """Start recording the stream into a CUDA graph."""

    def end_capture(self) -> Any:
        """Stop recording; the instantiated graph."""

    def abort_capture(self) -> None:
        """Discard a capture that failed part-way."""

    def replay(self, executable: Any) -> None:
        """Launch a captured graph."""

    def release_graph(self, executable: Any) -> None:
        """Free a captured graph."""


def tuning_enabled() -> bool:
    """Whether library calls are timed (`KNOPT_TUNE` is not "0")."""
    return os.environ.get(TUNE_ENV, "1").strip() != "0"


def cache_file(folder: Path, library: str, version: object, gpu: str) -> Path:
    """The file holding `library`'s choices on `gpu` (one per library version)."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{library}-{version}-{gpu}".lower()).strip("-")
    return folder / "tuning" / f"{slug}.json"


class TuningCache:
    """Choices by problem key in one JSON file.

    Attributes:
        path: The file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries = self._read()

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored choice for `key`, or None."""
        entry = self._entries.get(key)
        return entry if isinstance(entry, dict) else None

    def put(self, key: str, entry: dict[str, Any]) -> None:
        """Store a choice (merged with what other processes wrote since we read the file)."""
        self._entries = {**self._read(), key: entry}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
        with os.fdopen(handle, "w") as file:
            json.dump({"format": FORMAT, "entries": self._entries}, file, indent=1, sort_keys=True)
        os.replace(temporary, self.path)

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return {}
        entries = data.get("entries")
        return dict(entries) if isinstance(entries, dict) else {}


def key_text(*parts: object) -> str:
    """A problem key as stable text (the JSON key)."""
    return " ".join(str(p) for p in parts)


def time_candidates(gpu: Timer, candidates: Sequence[Callable[[], None]]) -> list[float]:
    """Seconds per call of each candidate (inf for one that fails), on the GPU's stream.

    Each candidate runs once eagerly (a failure there rules it out); then a CUDA graph of
    repeated calls, enough for about `TARGET_SECONDS` of device time, is timed between two
    events, so the host's launch rate does not hide the differences between fast kernels.
    Must run outside any stream capture.
    """
    times = []
    for call in candidates:
        try:
            single = _time_eagerly(gpu, call)
            repeats = max(1, min(MAX_REPEATS, math.ceil(TARGET_SECONDS / max(single, 1e-7))))
            times.append(_time_replayed(gpu, call, repeats))
        except CudaError:
            gpu.sync()
            times.append(math.inf)
    return times


def _time_eagerly(gpu: Timer, call: Callable[[], None]) -> float:
    call()  # first call: lazy initialization, and failures surface here
    gpu.sync()
    start = gpu.event()
    call()
    end = gpu.event()
    return gpu.elapsed_ms(start, end) / 1e3


def _time_replayed(gpu: Timer, call: Callable[[], None], repeats: int) -> float:
    gpu.begin_capture()
    try:
        for _ in range(repeats):
            call()
    except BaseException:
        gpu.abort_capture()
        raise
    graph = gpu.end_capture()
    try:
        gpu.replay(graph)  # warm: the first replay uploads and settles clocks
        start = gpu.event()
        gpu.replay(graph)
        end = gpu.event()
        return gpu.elapsed_ms(start, end) / 1e3 / repeats
    finally:
        gpu.sync()
        gpu.release_graph(graph)


def fastest(times: Sequence[float]) -> int:
    """The index of the smallest finite time.

    Raises:
        CudaError: If every candidate failed.
    """
    finite = [(t, i) for i, t in enumerate(times) if math.isfinite(t)]
    if not finite:
        raise CudaError("tuning", "no candidate", "every candidate algorithm failed to run")
    return min(finite)[1]
