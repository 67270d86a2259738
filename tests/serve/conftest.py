"""One small local Ray instance (2 CPUs, HTTP on the loopback address) for all serving tests."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest
import ray
from ray import serve


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def serve_url() -> Iterator[str]:
    """The base URL of Serve's HTTP proxy on a Ray instance started for the test session."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # tests send nothing anywhere
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()
