"""Cache keys: what a cached program depends on.

That is knopt's build, the device, the precision, the cost model and the model as bound to its
sizes.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from knopt.cache.serial import graph_digest
from knopt.ir.graph import Graph
from knopt.opt.cost import DeviceProfile
from knopt.version import __version__

# Files whose contents decide what the optimizer and the backends produce.
_SOURCE_SUFFIXES = (".py", ".egg", ".cu", ".cuh")


@dataclass(frozen=True)
class CacheKey:
    """Everything an entry must match to be used; any difference and the entry is ignored.

    Attributes:
        knopt: The version and a digest of knopt's sources (`knopt_build`).
        device: "cpu", or the GPU's fingerprint (name, architecture, driver, NVRTC).
        precision: The session's precision ("f32", "fp16", ...).
        profile: A digest of the cost model's numbers, which steer extraction.
        model: A digest of the bound graph: ops, weights, sizes (`graph_digest`).
    """

    knopt: str
    device: str
    precision: str
    profile: str
    model: str

    @property
    def name(self) -> str:
        """The entry's file name stem: a hash of all the fields."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:40]

    def to_json(self) -> dict[str, str]:
        """The key as a JSON object."""
        return asdict(self)


def cache_key(
    graph: Graph,
    profile: DeviceProfile,
    device: str,
    precision: str,
    sizes: Mapping[str, int] | None = None,
) -> CacheKey:
    """The key of the optimized program of `graph` for this device, precision and profile.

    `sizes`, the sizes symbolic dimensions are costed at, count as part of the profile.
    """
    costing = profile.to_json()
    if sizes:
        costing["sizes"] = dict(sorted(sizes.items()))
    profile_text = json.dumps(costing, sort_keys=True)
    return CacheKey(
        knopt=knopt_build(),
        device=device,
        precision=precision,
        profile=hashlib.sha256(profile_text.encode()).hexdigest()[:16],
        model=graph_digest(graph),
    )


@functools.cache
def knopt_build() -> str:
    """The version of knopt and a digest of its code, rules and kernel templates ("0.1.0+3fa4...").

    The digest makes an editable checkout whose files changed count as another build, although
    its version number stays the same.
    """
    root = Path(__file__).parents[1]
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in _SOURCE_SUFFIXES):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return f"{__version__}+{digest.hexdigest()[:16]}"


@functools.cache
def device_fingerprint(device: str) -> str:
    """The device's fingerprint: "cpu", or on "cuda" the name and versions of this process's GPU.

    Raises:
        CudaError: If the GPU cannot be queried.
    """
    if device != "cuda":
        return "cpu"
    from knopt.cuda.fingerprint import device_fingerprint as gpu_fingerprint

    return "cuda:" + gpu_fingerprint()
