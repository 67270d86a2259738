"""A served model on a local Ray instance: HTTP and handle answers, batching, errors, a lost
replica. The tests share one application (one CPU replica) and run in order; the replica is
killed last."""

from __future__ import annotations

import io
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from ray import serve
from ray.serve.handle import DeploymentHandle

import knopt
import knopt.serve
from knopt.errors import InputError
from tests.models import MODELS

MODEL = MODELS / "mlp_ts14.onnx"
ROUTE = "/mlp"


@dataclass
class Served:
    """The running application: its URL, a handle to its ingress and the reference session."""

    url: str
    handle: DeploymentHandle
    reference: knopt.Session


@pytest.fixture(scope="module")
def served(serve_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    app = knopt.serve.deployment(
        MODEL,
        device="cpu",
        num_replicas=1,
        max_batch_size=16,
        batch_wait_timeout_s=0.05,  # wide enough for threads on 2 busy cores to meet
        cache=tmp_path_factory.mktemp("cache"),
    )
    handle = serve.run(app, name="mlp", route_prefix=ROUTE)
    try:
        yield Served(serve_url + ROUTE, handle, knopt.compile(MODEL))
    finally:
        serve.delete("mlp")


def _rows(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((1 + seed % 3, 16)).astype(np.float32)


def _expected(served: Served, x: np.ndarray) -> np.ndarray:
    (logits,) = served.reference.run(None, {"input": x})
    return np.asarray(logits)


def _post(url: str, body: bytes, content_type: str) -> tuple[int, bytes, str]:
    request = urllib.request.Request(url, body, {"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read(), response.headers["content-type"]
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers["content-type"]


def _post_json(url: str, document: Any) -> tuple[int, Any]:
    status, body, _ = _post(url, json.dumps(document).encode(), "application/json")
    return status, json.loads(body)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.loads(response.read())


def _stats(served: Served) -> dict[str, Any]:
    return dict(served.handle.stats.remote().result())


def test_handle_answers_concurrent_requests_like_compile(served: Served) -> None:
    inputs = [_rows(seed) for seed in range(24)]
    responses = [served.handle.run.remote({"input": x}) for x in inputs]
    for x, response in zip(inputs, responses, strict=True):
        outputs = response.result()
        assert list(outputs) == ["logits"]
        np.testing.assert_allclose(outputs["logits"], _expected(served, x), rtol=1e-5, atol=1e-6)


def test_http_json_and_npz_answer_like_compile(served: Served) -> None:
    def ask(seed: int) -> None:
        x = _rows(seed)
        if seed % 3 == 0:
            buffer = io.BytesIO()
            np.savez(buffer, input=x)
            status, body, media = _post(served.url, buffer.getvalue(), "application/x-npz")
            assert (status, media) == (200, "application/x-npz")
            with np.load(io.BytesIO(body), allow_pickle=False) as archive:
                got = archive["logits"]
        else:
            flat = {"dtype": "float32", "shape": list(x.shape), "data": x.ravel().tolist()}
            value = x.tolist() if seed % 3 == 1 else flat
            status, answer = _post_json(served.url, {"inputs": {"input": value}, "id": str(seed)})
            assert status == 200, answer
            assert answer["id"] == str(seed)
            logits = answer["outputs"]["logits"]
            assert logits["dtype"] == "float32"
            got = np.array(logits["data"], np.float32).reshape(logits["shape"])
        np.testing.assert_allclose(got, _expected(served, x), rtol=1e-5, atol=1e-6)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(ask, range(24)))


def test_concurrent_requests_form_batches(served: Served) -> None:
    before = _stats(served)
    inputs = [_rows(seed) for seed in range(32)]
    responses = [served.handle.run.remote({"input": x}) for x in inputs]
    for response in responses:
        response.result()
    after = _stats(served)
    requests = after["requests"] - before["requests"]
    runs = after["runs"] - before["runs"]
    assert requests == 32
    assert runs < requests
    assert after["largest"] > 1
    # Every run was padded to a compiled size: a few sizes, not one per distinct row count.
    assert set(after["compiled"]) <= {1, 2, 4, 8, 16}


def test_bad_requests_get_4xx_with_a_message(served: Served) -> None:
    status, answer = _post_json(served.url, {"inputs": {"input": [[1.0, 2.0]]}})
    assert status == 400
    assert "input 'input' has size 2 on axis 1, expected 16" in answer["error"]
    status, answer = _post_json(served.url, {"inputs": {"image": [[1.0]]}})
    assert (status, "unknown input 'image'" in answer["error"]) == (400, True)
    document = {"inputs": {"input": _rows(0).tolist()}, "outputs": ["x"]}
    status, answer = _post_json(served.url, document)
    assert (status, "unknown output(s) ['x']" in answer["error"]) == (400, True)
    status, body, _ = _post(served.url, b"{not json", "application/json")
    assert status == 400 and "not JSON" in json.loads(body)["error"]
    status, body, _ = _post(served.url, b"a,b", "text/csv")
    assert status == 415 and "text/csv" in json.loads(body)["error"]
    with pytest.raises(InputError, match="expected float32"):
        served.handle.run.remote({"input": _rows(0).astype(np.float64)}).result()


def test_a_bad_request_among_good_ones_fails_alone(served: Served) -> None:
    good = [served.handle.run.remote({"input": _rows(seed)}) for seed in range(6)]
    bad = served.handle.run.remote({"input": np.ones((2, 3), np.float32)})
    assert all(r.result()["logits"].shape[1] == 8 for r in good)
    with pytest.raises(InputError, match="axis 1"):
        bad.result()


def test_metadata_and_health(served: Served) -> None:
    metadata = _get(served.url)
    assert metadata["inputs"] == [{"name": "input", "dtype": "float32", "shape": ["batch", 16]}]
    assert metadata["batch_axis"] == "batch"
    assert (metadata["device"], metadata["max_batch_size"]) == ("cpu", 16)
    assert _get(served.url + "/health") == {"status": "ok"}


def test_a_request_id_is_answered_once(served: Served) -> None:
    x = _rows(5)
    before = _stats(served)["requests"]
    first = served.handle.run.remote({"input": x}, request_id="same-id")
    second = served.handle.run.remote({"input": x}, request_id="same-id")
    np.testing.assert_array_equal(first.result()["logits"], second.result()["logits"])
    status, answer = _post_json(served.url, {"inputs": {"input": x.tolist()}, "id": "same-id"})
    assert (status, answer["id"]) == (200, "same-id")
    assert _stats(served)["requests"] == before + 1


def _model_replica_actor() -> Any:
    import ray

    names = [
        entry["name"]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if "KnoptModel" in entry["name"]
    ]
    (name,) = names
    return ray.get_actor(name, namespace="serve")


def test_killed_replica_is_replaced_and_no_request_is_lost(served: Served) -> None:
    import ray

    old = _stats(served)["replica"]
    answered: list[int] = []

    def ask(seed: int) -> None:
        x = _rows(seed)
        status, answer = _post_json(served.url, {"inputs": {"input": x.tolist()}})
        assert status == 200, answer
        got = np.array(answer["outputs"]["logits"]["data"], np.float32).reshape(-1, 8)
        np.testing.assert_allclose(got, _expected(served, x), rtol=1e-5, atol=1e-6)
        answered.append(seed)

    with ThreadPoolExecutor(6) as pool:
        results = [pool.submit(ask, seed) for seed in range(60)]
        while len(answered) < 10:
            time.sleep(0.01)
        time.sleep(0.02)  # into the next batch's wait, so that requests are in the replica
        ray.kill(_model_replica_actor(), no_restart=True)
        for result in results:
            result.result()
    assert sorted(answered) == list(range(60))
    replacement = _stats(served)
    assert replacement["replica"] != old
    # The replacement read the programs the first replica optimized instead of optimizing.
    assert replacement["cache"]["hits"] >= 1
