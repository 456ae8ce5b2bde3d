"""End to end: `python -m service` as a real uvicorn process on loopback, driven by httpx and tritonclient."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

import lu_core
from bench.service import streamed
from tests.service.wire import binary_request, parse_binary

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, **env: str) -> None:
        self.port = free_port()
        self.grpc_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {**os.environ, "LU_PORT": str(self.port), "LU_GRPC_PORT": str(self.grpc_port), "LU_DEVICE": "cpu",
                    "PYTHONUNBUFFERED": "1", **env}  # fmt: skip
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service"], cwd=ROOT, env=full_env, stderr=subprocess.PIPE, text=True
        )
        self.log: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def wait_ready(self, timeout: float = 180) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}: {''.join(self.log)}")
            try:
                r = httpx.get(f"{self.url}/readyz", timeout=2)
                if r.status_code == 200:
                    return r.json()
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"not ready after {timeout} s: {''.join(self.log)}")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        finally:
            self._reader.join(5)


def serving(**env: str) -> Iterator[Server]:
    """A module fixture's body: ``yield from serving(...)`` starts the server, waits for it, stops it after."""
    srv = Server(**env)
    try:
        srv.wait_ready()
        yield srv
    finally:
        if srv.proc.poll() is None:
            srv.stop()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(LU_WARMUP="true", LU_API_KEY="e2e-key")


AUTH = {"authorization": "Bearer e2e-key"}


def test_readyz_reports_the_cpu_and_versions(server):
    body = httpx.get(f"{server.url}/readyz").json()
    assert body["device"]["kind"] == "cpu" and body["versions"]["lu-service"]


def test_the_start_up_heap_is_frozen_once_ready(server):
    """The warm server keeps the garbage collector off what start-up built (service.__main__)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any("start-up heap frozen" in line for line in server.log):
        time.sleep(0.1)
    line = next(line for line in server.log if "start-up heap frozen" in line)
    assert json.loads(line)["objects"] > 10_000  # imports, kernels, routes


def test_json_and_binary_round_trips(server, rng):
    A = rng.standard_normal((4, 16, 16)) + 16 * np.eye(16)
    B = rng.standard_normal((4, 16, 3))
    r = httpx.post(f"{server.url}/solve", json={"A": A.tolist(), "B": B.tolist()}, headers=AUTH)
    assert r.status_code == 200
    np.testing.assert_array_equal(np.array(r.json()["X"]["data"]), lu_core.solve(A, B))
    body, headers = binary_request({"A": A})
    r = httpx.post(f"{server.url}/lu_factor", content=body, headers={**headers, **AUTH, "x-request-id": "e2e-1"})
    assert r.headers["x-request-id"] == "e2e-1"
    _, out = parse_binary(r.content, int(r.headers["inference-header-content-length"]))
    LU, piv, _ = lu_core.lu_factor_ex(A)
    np.testing.assert_array_equal(out["LU"], LU)
    np.testing.assert_array_equal(out["pivots"], piv)
    assert httpx.post(f"{server.url}/solve", json={}).status_code == 401


def test_oversized_body_is_refused_on_a_real_socket(server):
    big = b"0" * (300 << 20)  # over the default 256 MiB
    try:
        r = httpx.post(f"{server.url}/solve", **streamed(big, AUTH), timeout=60)
    except httpx.TransportError:
        return  # refused and closed before the upload ended: also a refusal
    assert r.status_code == 413 and r.json()["code"] == "request_too_large"


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_drives_the_v2_endpoints(server, rng, binary):
    httpclient = pytest.importorskip("tritonclient.http")
    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{server.port}")
    headers = dict(AUTH)  # tritonclient adds its own headers to the dict it is given
    assert client.is_server_live(headers=headers)
    assert client.is_server_ready(headers=headers)
    assert client.is_model_ready("lu_solve", headers=headers)
    meta = client.get_model_metadata("lu_solve", headers=headers)
    assert [i["name"] for i in meta["inputs"]] == ["LU", "pivots", "B"]

    A = (rng.standard_normal((3, 8, 8)) + 8 * np.eye(8)).astype(np.float32)
    inputs = [httpclient.InferInput("A", list(A.shape), "FP32")]
    inputs[0].set_data_from_numpy(A, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("LU", "pivots", "info")]
    result = client.infer("lu_factor", inputs, outputs=outputs, request_id="t-1", headers=dict(AUTH))
    LU, piv, info = lu_core.lu_factor_ex(A)
    np.testing.assert_array_equal(result.as_numpy("LU"), LU)
    np.testing.assert_array_equal(result.as_numpy("pivots"), piv)
    np.testing.assert_array_equal(result.as_numpy("info"), info)
    assert result.get_response()["id"] == "t-1"

    B = rng.standard_normal((3, 8, 2)).astype(np.float32)
    solve_inputs = []
    for name, arr, dt in (("LU", LU, "FP32"), ("pivots", piv, "INT32"), ("B", B, "FP32")):
        t = httpclient.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr, binary_data=binary)
        solve_inputs.append(t)
    X = client.infer(
        "lu_solve", solve_inputs, outputs=[httpclient.InferRequestedOutput("X", binary_data=binary)],
        parameters={"adjoint": True}, headers=dict(AUTH),
    ).as_numpy("X")  # fmt: skip
    np.testing.assert_array_equal(X, lu_core.lu_solve(LU, piv, B, adjoint=True))
    client.close()


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_and_requests_drive_the_refined_rcond_and_det_models(server, rng, binary):
    httpclient = pytest.importorskip("tritonclient.http")
    requests = pytest.importorskip("requests")
    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{server.port}")

    def tensor(name, arr, dt):
        t = httpclient.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr, binary_data=binary)
        return t

    def infer(model, inputs, names, **parameters):
        outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in names]
        result = client.infer(model, inputs, outputs=outputs, parameters=parameters or None, headers=dict(AUTH))
        return [result.as_numpy(n) for n in names]

    A = rng.standard_normal((3, 12, 12)) + 12 * np.eye(12)
    B = rng.standard_normal((3, 12, 2))
    X, it, berr = infer(
        "solve_refined", [tensor("A", A, "FP64"), tensor("B", B, "FP64")],
        ("X", "iterations", "backward_error"), factor_dtype="float32", max_iter=20,
    )  # fmt: skip
    want = lu_core.solve_refined(A, B, factor_dtype="float32", max_iter=20)
    np.testing.assert_array_equal(X, want.X)
    np.testing.assert_array_equal(it, want.iterations)
    np.testing.assert_array_equal(berr, want.backward_error)
    LU, piv = lu_core.lu_factor(A)
    anorm = np.abs(A).sum(axis=-1).max(axis=-1)
    (rcond,) = infer(
        "lu_rcond", [tensor("LU", LU, "FP64"), tensor("pivots", piv, "INT32"), tensor("anorm", anorm, "FP64")],
        ("rcond",), norm="inf",
    )  # fmt: skip
    np.testing.assert_array_equal(rcond, lu_core.lu_rcond(LU, piv, anorm, norm="inf"))
    sign, logabsdet = infer("slogdet", [tensor("A", A, "FP64")], ("sign", "logabsdet"))
    np.testing.assert_array_equal(sign, lu_core.slogdet(A).sign)
    np.testing.assert_array_equal(logabsdet, lu_core.slogdet(A).logabsdet)
    (det,) = infer("det", [tensor("A", A, "FP64")], ("det",))
    np.testing.assert_array_equal(det, lu_core.det(A))
    client.close()
    # The native routes with plain requests: an unsupported factor_dtype has its own code.
    r = requests.post(
        f"{server.url}/solve_refined", json={"A": A[0].tolist(), "B": B[0].tolist(), "factor_dtype": "float16"},
        headers=AUTH, timeout=30,
    )  # fmt: skip
    assert r.status_code == 422 and r.json()["code"] == "unsupported_factor_dtype"
    r = requests.post(f"{server.url}/det", json={"A": A[0].tolist()}, headers=AUTH, timeout=30)
    assert r.status_code == 200 and np.isclose(r.json()["det"]["data"], lu_core.det(A[0]))


def test_gpu_setting_without_a_gpu_fails_at_start():
    env = {
        **os.environ,
        "LU_DEVICE": "gpu",
        "LU_PORT": str(free_port()),
        "LU_GRPC_PORT": "0",
        "CUDA_VISIBLE_DEVICES": "",
    }
    done = subprocess.run(
        [sys.executable, "-m", "service"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "LU_DEVICE=gpu" in done.stderr


def test_graceful_shutdown_finishes_in_flight_requests(rng):
    srv = Server(LU_WARMUP="false")
    srv.wait_ready()
    grpcclient = pytest.importorskip("tritonclient.grpc")
    A = rng.standard_normal((300, 120, 120))
    body, headers = binary_request({"A": A})
    answers: list[httpx.Response] = []
    grpc_answers: list[np.ndarray] = []

    def grpc_call() -> None:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
        t = grpcclient.InferInput("A", list(A.shape), "FP64")
        t.set_data_from_numpy(A)
        grpc_answers.append(client.infer("lu_factor", [t], client_timeout=60).as_numpy("LU"))

    senders = [
        threading.Thread(
            target=lambda: answers.append(httpx.post(f"{srv.url}/lu", content=body, headers=headers, timeout=60))
        ),
        threading.Thread(target=grpc_call),
    ]
    for sender in senders:
        sender.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # SIGTERM once both are in flight (the scrape counts itself: the third)
        if "lu_requests_in_flight 3.0" in httpx.get(f"{srv.url}/metrics").text:
            break
        time.sleep(0.01)
    code = srv.stop()
    for sender in senders:
        sender.join(60)
    assert code in (0, -signal.SIGTERM), "".join(srv.log)  # uvicorn re-raises the signal once drained
    assert answers and answers[0].status_code == 200
    assert grpc_answers and grpc_answers[0].shape == A.shape  # the gRPC door drained too
    assert any('"msg":"stopped"' in line for line in srv.log)
