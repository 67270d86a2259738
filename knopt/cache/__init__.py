"""A shared on-disk cache of optimized programs, so that each is optimized once, not per process.

    cache = ProgramCache("/shared/knopt-cache")
    session = knopt.compile("model.onnx", "cuda", cache=cache)   # or cache="/shared/..."

See `knopt.cache.store` for the layout and the guarantees (atomic writes, one writer at a time,
entries of another knopt build, GPU or model ignored).
"""

from knopt.cache.key import CacheKey, cache_key, device_fingerprint, knopt_build
from knopt.cache.serial import CacheFormatError, graph_digest
from knopt.cache.store import CacheStats, ProgramCache, open_cache

__all__ = [
    "CacheFormatError",
    "CacheKey",
    "CacheStats",
    "ProgramCache",
    "cache_key",
    "device_fingerprint",
    "graph_digest",
    "knopt_build",
    "open_cache",
]
