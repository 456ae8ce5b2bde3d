"""Every tritonclient flavour, unchanged, through every operation of a real `python -m service` process.

http and http.aio in both tensor forms (JSON and binary), grpc and grpc.aio (raw
tensors); each call also carries Triton's options (priority, timeout, a sequence
id), and some compress their request. Results are compared bit for bit with
lu_core called directly.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio

import lu_core
from tests.service.test_e2e import Server, serving

KEY = "triton-key"
OIP = {np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64", np.dtype(np.int32): "INT32"}


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(LU_WARMUP="false", LU_API_KEY=KEY)


def cases(dtype: type) -> list[tuple[str, dict[str, np.ndarray], dict[str, np.ndarray], dict[str, Any]]]:
    rng = np.random.default_rng(21)
    A = (rng.standard_normal((2, 4, 4)) + 4 * np.eye(4)).astype(dtype)
    B = rng.standard_normal((2, 4, 3)).astype(dtype)
    LU, piv, info = lu_core.lu_factor_ex(A)
    return [
        ("lu_factor", {"A": A}, {"LU": LU, "pivots": piv, "info": info}, {}),
        ("lu_unpack", {"LU": LU, "pivots": piv}, dict(zip("PLU", lu_core.lu_unpack(LU, piv), strict=True)), {}),
        ("lu_solve", {"LU": LU, "pivots": piv, "B": B}, {"X": lu_core.lu_solve(LU, piv, B, adjoint=True)}, {"adjoint": True}),
        ("lu", {"A": A}, dict(zip("PLU", lu_core.lu(A), strict=True)), {}),
        ("solve", {"A": A, "B": B}, {"X": lu_core.solve(A, B, left=True)}, {"left": True}),
    ]  # fmt: skip


def check(result: Any, expected: dict[str, np.ndarray]) -> None:
    for name, value in expected.items():
        got = result.as_numpy(name)
        assert got.dtype == value.dtype and got.shape == value.shape, name
        np.testing.assert_array_equal(got, value)


def auth() -> dict[str, str]:
    return {"authorization": f"Bearer {KEY}"}  # fresh each call: tritonclient adds to the dict it is given


def options(i: int) -> dict[str, Any]:
    # Triton's request options ride along on every call; every other call is compressed.
    return {"priority": 1 + i % 2, "timeout": 60_000_000, "sequence_id": 0, "request_id": f"req-{i}"}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_http(server, binary, dtype):
    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{server.port}")
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("lu", headers=auth())
    assert client.get_server_metadata(headers=auth())["name"] == "lu-service"
    for i, (op, tensors, expected, params) in enumerate(cases(dtype)):
        assert client.get_model_metadata(op, headers=auth())["name"] == op
        inputs = []
        for name, arr in tensors.items():
            t = httpclient.InferInput(name, list(arr.shape), OIP[arr.dtype])
            t.set_data_from_numpy(arr, binary_data=binary)
            inputs.append(t)
        outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in expected]
        result = client.infer(op, inputs, outputs=outputs, parameters=params, headers=auth(),
                              request_compression_algorithm=("gzip", "deflate", None)[i % 3], **options(i))  # fmt: skip
        check(result, expected)
        assert result.get_response()["id"] == f"req-{i}"
    client.close()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_http_aio(server, binary):
    async def run() -> None:
        client = httpaio.InferenceServerClient(url=f"127.0.0.1:{server.port}")
        try:
            assert await client.is_server_live() and await client.is_server_ready()
            assert await client.is_model_ready("solve", headers=auth())
            for i, (op, tensors, expected, params) in enumerate(cases(np.float64)):
                inputs = []
                for name, arr in tensors.items():
                    t = httpclient.InferInput(name, list(arr.shape), OIP[arr.dtype])
                    t.set_data_from_numpy(arr, binary_data=binary)
                    inputs.append(t)
                outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in expected]
                result = await client.infer(op, inputs, outputs=outputs, parameters=params, headers=auth(),
                                            request_compression_algorithm=("gzip", None)[i % 2], **options(i))  # fmt: skip
                check(result, expected)
        finally:
            await client.close()

    asyncio.run(run())


def _grpc_inputs(tensors: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    inputs = []
    for name, arr in tensors.items():
        t = grpcclient.InferInput(name, list(arr.shape), OIP[arr.dtype])
        t.set_data_from_numpy(arr)
        inputs.append(t)
    return inputs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grpc(server, dtype):
    client = grpcclient.InferenceServerClient(url=f"127.0.0.1:{server.grpc_port}")
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("lu", headers=auth())
    assert client.get_server_metadata(headers=auth()).name == "lu-service"
    for i, (op, tensors, expected, params) in enumerate(cases(dtype)):
        assert [t.name for t in client.get_model_metadata(op, headers=auth()).inputs] == list(tensors)
        outputs = [grpcclient.InferRequestedOutput(n) for n in expected]
        result = client.infer(op, _grpc_inputs(tensors), outputs=outputs, parameters=params, headers=auth(),
                              compression_algorithm=("gzip", "deflate", None)[i % 3], client_timeout=60,
                              **options(i))  # fmt: skip
        check(result, expected)
        assert result.get_response().id == f"req-{i}"
    with pytest.raises(grpcclient.InferenceServerException) as info:
        client.infer("lu", _grpc_inputs({"A": np.eye(2)}))  # no key
    assert info.value.status() == "StatusCode.UNAUTHENTICATED"
    client.close()


def test_grpc_aio(server):
    async def run() -> None:
        client = grpcaio.InferenceServerClient(url=f"127.0.0.1:{server.grpc_port}")
        try:
            assert await client.is_server_live() and await client.is_server_ready()
            for i, (op, tensors, expected, params) in enumerate(cases(np.float64)):
                result = await client.infer(op, _grpc_inputs(tensors), parameters=params, headers=auth(),
                                            compression_algorithm=("gzip", None)[i % 2], **options(i))  # fmt: skip
                check(result, expected)
        finally:
            await client.close()

    asyncio.run(run())


def test_grpc_log_lines_are_json_with_the_request_id(server):
    client = grpcclient.InferenceServerClient(url=f"127.0.0.1:{server.grpc_port}")
    client.is_server_live(headers={"x-request-id": "grpc-trace-1"})
    client.close()
    for _ in range(50):
        lines = [json.loads(x) for x in server.log if x.startswith("{") and "grpc-trace-1" in x]
        if lines:
            break
        time.sleep(0.05)
    assert lines and lines[0]["logger"] == "service.access" and lines[0]["status"] == "OK"
    assert lines[0]["path"] == "/inference.GRPCInferenceService/ServerLive"
