"""`ProgramCache`: a directory of optimized programs that several processes share.

Layout of the directory:

    programs/<key>.npz    one optimized program: a JSON header (its key, the graph, the kernel
                          grouping, the report) and the graph's constants as raw bytes
    programs/<key>.lock   taken (flock) by the process that optimizes that program
    cubin/                NVRTC's compiled kernels, when a cuda session uses the cache

An entry is written to a temporary file and renamed into place, so a reader sees a whole entry
or none. The process that finds no entry takes the entry's lock before optimizing; another that
wants the same program waits on the lock and then reads what the first one wrote, so a program
is optimized once however many replicas start together. Entries are read with
`allow_pickle=False` and rebuilt from a closed set of op classes (`knopt.cache.serial`); an entry
that does not match its key (another knopt build, GPU or model) or does not parse is ignored
and replaced.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from knopt.cache.key import CacheKey, cache_key, device_fingerprint
from knopt.cache.serial import CacheFormatError, dump_graph, load_graph
from knopt.errors import KnoptError
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph
from knopt.ir.program import program_from_graph
from knopt.opt.cost import DeviceProfile
from knopt.opt.optimize import OptimizeResult, optimize
from knopt.opt.report import OptimizeReport, Pattern

FORMAT = 1  # bump when the header's layout changes


@dataclass
class CacheStats:
    """What a `ProgramCache` did in this process.

    Attributes:
        hits: Programs read from an entry instead of optimized.
        writes: Programs optimized here and written.
        ignored: Entries found but not used: another build, device or model, or damaged.
    """

    hits: int = 0
    writes: int = 0
    ignored: int = 0


class ProgramCache:
    """Optimized programs on disk, keyed by knopt build, device, precision, profile and model.

    Args:
        directory: The cache's folder (made if missing); on a cluster, a shared filesystem.

    Raises:
        KnoptError: If the folder cannot be made.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.stats = CacheStats()
        try:
            (self.directory / "programs").mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise KnoptError(f"program cache {self.directory}: cannot make it ({err})") from err

    @property
    def cubin_dir(self) -> Path:
        """Where cuda sessions using this cache keep NVRTC's compiled kernels."""
        return self.directory / "cubin"

    def path(self, key: CacheKey) -> Path:
        """The entry file of `key`."""
        return self.directory / "programs" / f"{key.name}.npz"

    def optimize(
        self,
        graph: Graph,
        profile: DeviceProfile,
        *,
        device: str,
        precision: str,
        sizes: Mapping[str, int] | None = None,
    ) -> OptimizeResult:
        """The optimized program of `graph`: read from the cache, or optimized and written.

        Args:
            graph: The graph (its symbolic sizes stay symbolic).
            profile: The cost model to optimize with.
            device: "cpu" or "cuda" (this process's GPU, by its fingerprint).
            precision: The session's precision.
            sizes: The sizes symbolic dimensions are costed at (`knopt.optimize`'s `sizes`).

        Raises:
            KnoptError: If optimizing fails or the entry cannot be written.
            CudaError: If the GPU cannot be queried for its fingerprint.
        """
        key = cache_key(graph, profile, device_fingerprint(device), precision, sizes)
        found = self._read(key)
        if found is not None:
            return found
        with self._locked(key):
            # Another process may have written the entry while this one waited for the lock.
            found = self._read(key, count_ignored=False)
            if found is not None:
                return found
            result = optimize(graph, profile=profile, sizes=sizes)
            self.write(key, result)
        return result

    def write(self, key: CacheKey, result: OptimizeResult) -> Path:
        """Write `result` as the entry of `key` (atomically: temporary file, then rename).

        Raises:
            KnoptError: If the file cannot be written.
        """
        header, arrays = _encode_result(key, result)
        members: dict[str, Any] = {"header": np.frombuffer(header, np.uint8), **arrays}
        path = self.path(key)
        try:
            handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            try:
                with os.fdopen(handle, "wb") as file:
                    np.savez(file, **members)
                    file.flush()
                    os.fsync(file.fileno())
                os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide it from other users
                os.replace(temporary, path)
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
        except OSError as err:
            raise KnoptError(f"program cache {path}: cannot write it ({err})") from err
        self.stats.writes += 1
        return path

    def _read(self, key: CacheKey, *, count_ignored: bool = True) -> OptimizeResult | None:
        path = self.path(key)
        if not path.exists():
            return None
        try:
            result = _read_entry(path, key)
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, CacheFormatError):
            result = None
        if result is None:
            self.stats.ignored += count_ignored
            return None
        self.stats.hits += 1
        return result

    @contextmanager
    def _locked(self, key: CacheKey) -> Iterator[None]:
        lock = self.path(key).with_suffix(".lock")
        with open(lock, "a+b") as file:
            fcntl.flock(file, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(file, fcntl.LOCK_UN)


def open_cache(cache: str | os.PathLike[str] | ProgramCache, device: str) -> ProgramCache:
    """The cache of a session on `device`; on "cuda" NVRTC's cubins move into it as well.

    NVRTC's cache folder is process-wide ($KNOPT_CACHE_DIR, which this sets): a process serving
    one model keeps everything it compiles in one shared place.

    Raises:
        KnoptError: If the folder cannot be made.
    """
    found = cache if isinstance(cache, ProgramCache) else ProgramCache(cache)
    if device == "cuda":
        os.environ["KNOPT_CACHE_DIR"] = str(found.cubin_dir)
    return found


def _encode_result(key: CacheKey, result: OptimizeResult) -> tuple[bytes, dict[str, np.ndarray]]:
    """The entry's JSON header and its constant arrays (raw bytes, named c0, c1, ...)."""
    encoded, constants = dump_graph(result.graph)
    index = {node: i for i, node in enumerate(result.graph.nodes)}
    header = {
        "format": FORMAT,
        "key": key.to_json(),
        "graph": encoded,
        "constants": [
            {"dtype": DType.from_numpy(a.dtype).name, "shape": list(a.shape)} for a in constants
        ],
        "groups": [[index[node], group] for node, group in result.groups.items()],
        "kinds": [[group, kind] for group, kind in result.group_kinds.items()],
        "kernels": [[k.cost, list(k.names)] for k in result.program.kernels],
        "report": result.report.to_json(),
    }
    arrays = {f"c{i}": np.frombuffer(a.tobytes(), np.uint8) for i, a in enumerate(constants)}
    return json.dumps(header).encode(), arrays


def _read_entry(path: Path, key: CacheKey) -> OptimizeResult | None:
    """The entry at `path` if it is a whole entry of `key`, else None.

    Raises:
        CacheFormatError, ValueError, KeyError, TypeError, OSError: If it does not parse.
    """
    with np.load(path, allow_pickle=False) as archive:
        header = json.loads(archive["header"].tobytes().decode())
        if header.get("format") != FORMAT or header.get("key") != key.to_json():
            return None
        arrays = [
            np.frombuffer(archive[f"c{i}"].tobytes(), DType[c["dtype"]].numpy).reshape(c["shape"])
            for i, c in enumerate(header["constants"])
        ]
    graph, nodes = load_graph(header["graph"], arrays)
    groups = {nodes[i]: int(group) for i, group in header["groups"]}
    program = program_from_graph(graph, groups)
    if len(program.kernels) != len(header["kernels"]):
        raise CacheFormatError(f"{path}: the kernel grouping does not fit the graph")
    program.kernels = [
        dataclasses.replace(kernel, cost=float(cost), names=tuple(str(n) for n in names))
        for kernel, (cost, names) in zip(program.kernels, header["kernels"], strict=True)
    ]
    kinds = {int(group): str(kind) for group, kind in header["kinds"]}
    return OptimizeResult(graph, program, _report(header["report"]), groups, kinds)


def _report(data: dict[str, Any]) -> OptimizeReport:
    patterns = [Pattern(**p) for p in data["patterns"]]
    return OptimizeReport(**{**data, "patterns": patterns})
