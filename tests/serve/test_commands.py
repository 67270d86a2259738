"""`knopt compile --cache` and `knopt serve`."""

from __future__ import annotations

import argparse
import json
import re
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from ray import serve

import knopt
from knopt.cli import main
from knopt.commands import serve as serve_command
from knopt.errors import KnoptError
from tests.models import MODELS

MLP = MODELS / "mlp_ts14.onnx"


def test_compile_writes_one_program_for_every_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    assert main(["compile", str(MLP), "--cache", str(cache), "--dims", "batch=1,3"]) == 0
    out = capsys.readouterr().out
    # One optimized program serves every batch size (issue #12): the first size makes it.
    assert "batch=1: optimized and written" in out and "batch=3: in the cache" in out
    assert len(list((cache / "programs").glob("*.npz"))) == 1
    assert main(["compile", str(MLP), "--cache", str(cache), "--dims", "batch=3"]) == 0
    assert "batch=3: in the cache" in capsys.readouterr().out
    session = knopt.compile(MLP, optimize=True, cache=cache)
    session.run(None, {"input": np.ones((3, 16), np.float32)})
    assert session.cache is not None
    assert (session.cache.stats.hits, session.cache.stats.writes) == (1, 0)


@pytest.mark.parametrize(
    ("dims", "message"),
    [
        ([], r"give sizes for \['batch'\]"),
        (["--dims", "batch=1", "--dims", "seq=2"], r"--dims \['seq'\]"),
        (["--dims", "batch=0"], "positive sizes"),
        (["--dims", "batch=1,x"], "positive sizes"),
    ],
)
def test_compile_names_wrong_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dims: list[str], message: str
) -> None:
    assert main(["compile", str(MLP), "--cache", str(tmp_path), *dims]) == 2
    assert re.search(message, capsys.readouterr().err)


def _serve_args(port: int, tmp_path: Path) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_command.add_parser(parser.add_subparsers())
    options = ["--port", str(port), "--device", "best", "--replicas", "1", "--route", "/cli"]
    return parser.parse_args(["serve", str(MLP), *options, "--cache", str(tmp_path)])


def test_serve_command_deploys_the_model(serve_url: str, tmp_path: Path) -> None:
    port = int(serve_url.rsplit(":", 1)[1])
    url = serve_command.start(_serve_args(port, tmp_path))
    try:
        assert url == f"http://127.0.0.1:{port}/cli"
        with urllib.request.urlopen(url, timeout=60) as response:
            metadata = json.loads(response.read())
        assert (metadata["device"], metadata["batch_axis"]) == ("cpu", "batch")
    finally:
        serve.delete(serve_command.APP_NAME)


def test_serve_command_refuses_bad_replica_counts(serve_url: str, tmp_path: Path) -> None:
    args = _serve_args(int(serve_url.rsplit(":", 1)[1]), tmp_path)
    args.replicas = "lots"
    with pytest.raises(KnoptError, match="a number or 'auto'"):
        serve_command.start(args)
