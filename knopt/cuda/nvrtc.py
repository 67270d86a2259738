"""NVRTC: generated CUDA C++ to cubin for the device's architecture, cached on disk.

The cache key is a hash of the source, the options (architecture included) and the NVRTC
version; entries are written to a temporary file and renamed, so a crash never leaves a torn
one. A failed compile raises `CudaError` with NVRTC's log and the numbered source.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cuda.bindings import nvrtc

from knopt.cuda.driver import check
from knopt.cuda.templates import headers
from knopt.errors import CudaError

BASE_OPTIONS = ("--std=c++17", "--fmad=true", "--extra-device-vectorization")


@dataclass
class CompileStats:
    """What `compile_cubin` did in this process.

    Attributes:
        compiles: Translation units NVRTC compiled.
        cache_hits: Translation units read from the on-disk cache instead.
    """

    compiles: int = 0
    cache_hits: int = 0


stats = CompileStats()
_stats_lock = threading.Lock()  # compiles run on several threads at once


def version() -> tuple[int, int]:
    """NVRTC's (major, minor) version."""
    major, minor = check("nvrtcVersion", nvrtc.nvrtcVersion())
    return int(major), int(minor)


def include_dirs() -> list[str]:
    """Where cuda_fp16.h and cuda_bf16.h are: the pip wheel's include folder, else CUDA_HOME."""
    from cuda import pathfinder

    found = []
    for name in ("cudart", "nvrtc"):
        path = pathfinder.find_nvidia_header_directory(name)
        if path and path not in found:
            found.append(path)
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    if Path(home, "include", "cuda_fp16.h").exists():
        found.append(str(Path(home, "include")))
    return found


def cache_dir() -> Path:
    """The cubin cache: $KNOPT_CACHE_DIR, else ~/.cache/knopt/cubin."""
    root = os.environ.get("KNOPT_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "knopt" / "cubin"


def options(arch: str) -> list[str]:
    """The full NVRTC option list for `arch` (such as "sm_90")."""
    return [f"--gpu-architecture={arch}", *BASE_OPTIONS, *(f"-I{d}" for d in include_dirs())]


def compile_cubin(source: str, arch: str, name: str = "knopt.cu") -> bytes:
    """Compile one translation unit (codegen headers available by name) to a cubin.

    Raises:
        CudaError: If NVRTC fails; the message has its log and the numbered source.
    """
    opts = options(arch)
    included = headers()
    key = hashlib.sha256(
        "\0".join(
            [source, *opts, repr(version()), *(included[h] for h in sorted(included))]
        ).encode()
    )
    path = cache_dir() / f"{key.hexdigest()}.cubin"
    if path.exists():
        data = path.read_bytes()
        digest, cubin = data[:32], data[32:]
        if hashlib.sha256(cubin).digest() == digest:
            with _stats_lock:
                stats.cache_hits += 1
            return cubin
    with _stats_lock:
        stats.compiles += 1
    cubin = _compile(source, name, opts, included)
    _store(path, cubin)
    return cubin


def _compile(source: str, name: str, opts: Sequence[str], included: dict[str, str]) -> bytes:
    names = [h.encode() for h in included]
    texts = [included[h].encode() for h in included]
    program = check(
        "nvrtcCreateProgram",
        nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), len(names), texts, names),
    )
    try:
        encoded = [o.encode() for o in opts]
        (status,) = nvrtc.nvrtcCompileProgram(program, len(encoded), encoded)
        if int(status) != 0:
            raise CudaError(
                "nvrtcCompileProgram",
                getattr(status, "name", status),
                f"{_log(program)}\n{numbered(source)}",
            )
        size = check("nvrtcGetCUBINSize", nvrtc.nvrtcGetCUBINSize(program))
        cubin = b" " * size
        check("nvrtcGetCUBIN", nvrtc.nvrtcGetCUBIN(program, cubin))
        return cubin
    finally:
        check("nvrtcDestroyProgram", nvrtc.nvrtcDestroyProgram(program))


def _log(program: object) -> str:
    size = check("nvrtcGetProgramLogSize", nvrtc.nvrtcGetProgramLogSize(program))
    log = b" " * size
    check("nvrtcGetProgramLog", nvrtc.nvrtcGetProgramLog(program, log))
    return log.decode(errors="replace").rstrip("\x00 \n")


def numbered(source: str) -> str:
    """The source with line numbers, as compile errors quote it."""
    return "\n".join(f"{i:5d}  {line}" for i, line in enumerate(source.splitlines(), 1))


def _store(path: Path, cubin: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(handle, "wb") as file:
        file.write(hashlib.sha256(cubin).digest() + cubin)
    os.replace(temporary, path)
