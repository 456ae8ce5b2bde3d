"""The gRPC door in-process: tritonclient.grpc.aio and a raw stub against an app on the test's event loop."""

from __future__ import annotations

import asyncio
import socket
import zlib

import grpc
import numpy as np
import pytest
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

import lu_core
from service.errors import ServiceError
from service.grpc_server import GRPC_STATUS, grpc_status
from tests.service.test_worker import GatedDevice

pytestmark = pytest.mark.anyio

OIP = {np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64", np.dtype(np.complex64): "COMPLEX64",
       np.dtype(np.complex128): "COMPLEX128", np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64"}  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def make_grpc(make_client):
    """(http client, grpc.aio tritonclient, raw stub) for an app with its gRPC door open."""
    opened = []

    async def build(**settings):
        http = await make_client(grpc_port=free_port(), **settings)
        target = f"127.0.0.1:{http.app.state.grpc.port}"
        client = grpcclient.InferenceServerClient(target)
        channel = grpc.aio.insecure_channel(target, options=[("grpc.max_receive_message_length", -1)])
        opened.append((client, channel))
        return http, client, pb_grpc.GRPCInferenceServiceStub(channel)

    yield build
    for client, channel in opened:
        await client.close()
        await channel.close()


def infer_inputs(tensors: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    inputs = []
    for name, arr in tensors.items():
        t = grpcclient.InferInput(name, list(arr.shape), OIP[arr.dtype])
        t.set_data_from_numpy(arr)
        inputs.append(t)
    return inputs


def well(rng, shape, dtype):
    A = rng.standard_normal(shape) + shape[-1] * np.eye(*shape[-2:])
    if np.dtype(dtype).kind == "c":
        A = A + 1j * rng.standard_normal(shape)
    return A.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])  # (tritonclient has no complex; see the raw stub)
async def test_every_operation_through_grpc_aio(make_grpc, rng, dtype):
    _, client, _ = await make_grpc()
    A = well(rng, (3, 5, 5), dtype)
    B = well(rng, (3, 5, 2), dtype)
    LU, piv, info = lu_core.lu_factor_ex(A)
    expected = {
        "lu_factor": ({"A": A}, {"LU": LU, "pivots": piv, "info": info}, {}),
        "lu_unpack": ({"LU": LU, "pivots": piv}, dict(zip("PLU", lu_core.lu_unpack(LU, piv), strict=True)), {}),
        "lu_solve": ({"LU": LU, "pivots": piv, "B": B}, {"X": lu_core.lu_solve(LU, piv, B, adjoint=True)}, {"adjoint": True}),
        "lu": ({"A": A}, dict(zip("PLU", lu_core.lu(A), strict=True)), {}),
        "solve": ({"A": A, "B": B}, {"X": lu_core.solve(A, B, left=True)}, {"left": True}),
    }  # fmt: skip
    for op, (tensors, outputs, params) in expected.items():
        result = await client.infer(op, infer_inputs(tensors), parameters=params, request_id=f"id-{op}")
        assert result.get_response().id == f"id-{op}" and result.get_response().model_name == op
        for name, value in outputs.items():
            got = result.as_numpy(name)
            assert got.dtype == value.dtype and got.shape == value.shape, name
            np.testing.assert_array_equal(got, value)


async def test_health_and_metadata(make_grpc):
    http, client, _ = await make_grpc()
    assert await client.is_server_live() and await client.is_server_ready()
    assert await client.is_model_ready("lu_solve") and await client.is_model_ready("lu_solve", "1")
    server = await client.get_server_metadata(as_json=True)
    assert server["name"] == "lu-service" and "binary_tensor_data" in server["extensions"]
    meta = await client.get_model_metadata("lu_solve")
    rest = (await http.get("/v2/models/lu_solve")).json()
    for tensors, listed in ((meta.inputs, rest["inputs"]), (meta.outputs, rest["outputs"])):
        assert [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in tensors] == listed
    assert meta.platform == "lu_core" and list(meta.versions) == ["1"]
    http.app.state.ready.clear()
    assert await client.is_server_live() and not await client.is_server_ready()
    assert not await client.is_model_ready("lu")
    with pytest.raises(InferenceServerException) as info:
        await client.infer("lu", infer_inputs({"A": np.eye(2)}))
    assert info.value.status() == "StatusCode.UNAVAILABLE"


async def test_typed_contents_and_request_ids_with_a_raw_stub(make_grpc, rng):
    http, _, stub = await make_grpc()
    A = well(rng, (2, 3, 3), np.complex64)
    LU, piv = lu_core.lu_factor(A)
    B = rng.standard_normal((2, 3, 1))
    request = pb.ModelInferRequest(model_name="lu_solve", id="typed")
    request.inputs.add(name="LU", datatype="COMPLEX64", shape=LU.shape).contents.fp32_contents.extend(
        np.ascontiguousarray(LU).view(np.float32).ravel().tolist()
    )
    request.inputs.add(name="pivots", datatype="INT32", shape=piv.shape).contents.int_contents.extend(
        piv.ravel().tolist()
    )
    request.inputs.add(name="B", datatype="FP64", shape=B.shape).contents.fp64_contents.extend(B.ravel().tolist())
    request.outputs.add(name="X")
    call = stub.ModelInfer(request, metadata=(("x-request-id", "trace-7"),))
    response = await call
    X = np.frombuffer(response.raw_output_contents[0], np.complex128).reshape(response.outputs[0].shape)
    np.testing.assert_array_equal(X, lu_core.lu_solve(LU, piv, B))
    assert response.outputs[0].datatype == "COMPLEX128" and response.id == "typed"
    assert ("x-request-id", "trace-7") in tuple(await call.trailing_metadata())
    metrics = (await http.get("/metrics")).text
    assert 'endpoint="/inference.GRPCInferenceService/ModelInfer",method="gRPC",status="OK"' in metrics
    assert 'lu_compute_seconds_count{device="cpu",operation="lu_solve"} 1.0' in metrics


def _request(model: str = "lu_factor", **inputs: tuple[str, list[int], bytes]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    for name, (datatype, shape, raw) in inputs.items():
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(raw)
    return request


EYE = np.eye(2).tobytes()
BAD_REQUESTS = [
    (_request("qr", A=("FP64", [2, 2], EYE)), "NOT_FOUND", "unknown_model"),
    (_request("lu_factor", A=("FP64", [2, 3], EYE)), "INVALID_ARGUMENT", "shape_mismatch"),
    (_request("lu_factor", A=("FP64", [-2, -2], EYE)), "INVALID_ARGUMENT", "malformed_tensor"),
    (_request("lu_factor", A=("STRING", [2, 2], EYE)), "INVALID_ARGUMENT", "invalid_dtype"),
    (_request("lu_factor", A=("FP16", [2, 2], EYE[:8])), "INVALID_ARGUMENT", "invalid_dtype"),
    (_request("lu_factor", A=("FP64", [4], EYE)), "INVALID_ARGUMENT", "invalid_shape"),
    (_request("lu_factor", Z=("FP64", [2, 2], EYE)), "INVALID_ARGUMENT", "unknown_input"),
    (_request("lu_factor"), "INVALID_ARGUMENT", "missing_input"),
    (_request("solve", A=("FP64", [2, 2], bytes(32)), B=("FP64", [2], bytes(16))), "INVALID_ARGUMENT", "singular_matrix"),
    (_request("lu_factor", A=("FP64", [2, 2], np.array([[1, np.nan], [np.inf, 1]]).tobytes())), "OK", ""),
    (_request("lu_factor", A=("FP64", [1 << 20, 1 << 20], EYE)), "RESOURCE_EXHAUSTED", "too_many_elements"),
    (_request("lu_unpack", LU=("FP64", [3000, 1], bytes(24000)), pivots=("INT32", [1], bytes(4))), "INVALID_ARGUMENT", "output_too_large"),
    # An empty tensor's other dimensions count (as over HTTP), before any array is made of them.
    (_request("det", A=("FP64", [1 << 62, 0, 0], b"")), "RESOURCE_EXHAUSTED", "too_many_elements"),
    (_request("det", A=("FP64", [1 << 40, 0, 0], b"")), "RESOURCE_EXHAUSTED", "too_many_elements"),
    (_request("x" * 100_000, A=("FP64", [2, 2], EYE)), "NOT_FOUND", "unknown_model"),  # quoted briefly: fits the trailers
    (_request("det", **{"x" * 100_000: ("FP64", [2, 2], EYE[:8])}), "INVALID_ARGUMENT", "shape_mismatch"),  # a long name: cut
    # Out-of-range pivots (0, past n, negative) never reach a kernel; a rank past 32 is refused as over HTTP.
    *[
        (_request("lu_solve", LU=("FP64", [2, 2], EYE), pivots=("INT32", [2], np.array(p, np.int32).tobytes()), B=("FP64", [2, 1], bytes(16))), "INVALID_ARGUMENT", "invalid_pivots")
        for p in ([0, 2], [1, 3], [-1, 2], [2**31 - 1, 2])
    ],
    (_request("det", A=("FP64", [1] * 31 + [2, 2], EYE)), "INVALID_ARGUMENT", "malformed_tensor"),
]  # fmt: skip


def _with(request: pb.ModelInferRequest, edit) -> pb.ModelInferRequest:
    edit(request)
    return request


BAD_REQUESTS += [
    (_with(_request("lu_factor", A=("FP64", [2, 2], EYE)), lambda r: r.raw_input_contents.append(b"")), "INVALID_ARGUMENT", "malformed_body"),
    (_with(_request("lu_factor", A=("FP64", [2, 2], EYE)), lambda r: r.parameters["pivto"].CopyFrom(pb.InferParameter(bool_param=True))), "INVALID_ARGUMENT", "unknown_option"),
    (_with(_request("lu_factor", A=("FP64", [2, 2], EYE)), lambda r: r.parameters["pivot"].CopyFrom(pb.InferParameter(string_param="yes"))), "INVALID_ARGUMENT", "invalid_option"),
    (_with(_request("lu_factor", A=("FP64", [2, 2], EYE)), lambda r: r.parameters["timeout"].CopyFrom(pb.InferParameter(string_param="x" * 100_000))), "INVALID_ARGUMENT", "invalid_option"),
    (_with(pb.ModelInferRequest(model_name="det"), lambda r: r.inputs.add(name="A", datatype="FP64", shape=[1 << 62, 0, 0])), "RESOURCE_EXHAUSTED", "too_many_elements"),
    (_with(_request("lu_factor", A=("FP64", [2, 2], EYE)), lambda r: r.outputs.add(name="X")), "INVALID_ARGUMENT", "unknown_output"),
    (_with(pb.ModelInferRequest(model_name="lu_factor"), lambda r: r.inputs.add(name="A", datatype="FP64", shape=[2, 2]).contents.fp64_contents.extend([1.0])), "INVALID_ARGUMENT", "shape_mismatch"),
    (_with(pb.ModelInferRequest(model_name="lu_factor"), lambda r: r.inputs.add(name="A", datatype="INT8", shape=[1, 1]).contents.int_contents.extend([300])), "INVALID_ARGUMENT", "malformed_tensor"),
    (_with(pb.ModelInferRequest(model_name="lu_factor"), lambda r: r.inputs.add(name="A", datatype="FP16", shape=[1, 1])), "INVALID_ARGUMENT", "malformed_tensor"),
    (_with(_request("lu_factor", A=("FP64", [2, 2], EYE)), lambda r: r.inputs[0].contents.fp64_contents.extend([1.0] * 4)), "INVALID_ARGUMENT", "malformed_tensor"),
    (_with(_request("lu_factor", A=("FP64", [2, 2], EYE)), lambda r: r.inputs.add(name="A", datatype="FP64", shape=[2, 2]) and r.raw_input_contents.append(EYE)), "INVALID_ARGUMENT", "malformed_tensor"),
]  # fmt: skip


@pytest.mark.parametrize("method", ["ModelInfer", "ModelMetadata", "ServerLive", "RepositoryIndex"])
@pytest.mark.parametrize("payload", [b"\xff\xff\xff\xff garbage", b"\x0a\xff\xff\xff\xff\x0f", b"\x08" * 3])
async def test_a_message_protobuf_cannot_parse_is_invalid_argument(make_grpc, method, payload):
    """Bytes that are no message of the RPC's type: INVALID_ARGUMENT in the error model (grpcio answered UNKNOWN
    itself, "Unexpected <class 'google.protobuf.message.DecodeError'>", before the servicer ran; found by a
    helper's audit), and the server goes on."""
    http, _, stub = await make_grpc()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{http.app.state.grpc.port}") as channel:
        raw = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")  # bytes in and out
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await raw(payload)
    assert info.value.code().name == "INVALID_ARGUMENT", info.value.details()
    assert "not a valid" in info.value.details()
    trailing = dict(info.value.trailing_metadata() or ())
    assert trailing["lu-error-code"] == "malformed_request" and trailing["x-request-id"]
    assert (await stub.ServerLive(pb.ServerLiveRequest())).live


@pytest.mark.parametrize(("request_", "status", "code"), BAD_REQUESTS)
async def test_errors_map_to_grpc_codes_never_unknown(make_grpc, request_, status, code):
    _, _, stub = await make_grpc(max_elements=1 << 12)
    call = stub.ModelInfer(request_)
    if status == "OK":
        await call
        return
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code().name == status, info.value.details()
    assert ("lu-error-code", code) in tuple(info.value.trailing_metadata()), info.value.trailing_metadata()


async def test_api_key_as_bearer_metadata(make_grpc):
    _, client, stub = await make_grpc(api_key="k1")
    assert await client.is_server_live() and await client.is_server_ready()  # health stays open
    with pytest.raises(InferenceServerException) as info:
        await client.get_model_metadata("lu")
    assert info.value.status() == "StatusCode.UNAUTHENTICATED"
    with pytest.raises(grpc.aio.AioRpcError) as raw:
        await stub.ModelInfer(_request(A=("FP64", [2, 2], EYE)), metadata=(("authorization", "Bearer nope"),))
    assert raw.value.code() == grpc.StatusCode.UNAUTHENTICATED
    result = await client.infer("lu", infer_inputs({"A": np.eye(2)}), headers={"authorization": "Bearer k1"})
    np.testing.assert_array_equal(result.as_numpy("L"), np.eye(2))


async def test_message_limit_and_compressed_bomb_are_resource_exhausted(make_grpc):
    _, client, stub = await make_grpc(max_request_bytes=1 << 20)
    big = np.zeros((400, 400))  # 1.28 MB raw
    with pytest.raises(InferenceServerException) as info:
        await client.infer("lu_factor", infer_inputs({"A": big}))
    assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    # 1.28 MB of zeros gzips to about a kilobyte; the bound holds for the inflated message.
    with pytest.raises(grpc.aio.AioRpcError) as raw:
        await stub.ModelInfer(_request(A=("FP64", [400, 400], big.tobytes())), compression=grpc.Compression.Gzip)
    assert raw.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(zlib.compress(big.tobytes())) < 4096
    small = await client.infer("lu_factor", infer_inputs({"A": np.eye(3)}), compression_algorithm="gzip")
    np.testing.assert_array_equal(small.as_numpy("LU"), np.eye(3))


async def test_overload_and_timeout_option_are_mapped(make_grpc):
    http, client, _ = await make_grpc(max_queue=1)
    device = GatedDevice()
    http.app.state.worker.device = device
    running = asyncio.ensure_future(client.infer("lu", infer_inputs({"A": np.eye(2)})))
    await asyncio.to_thread(device.started.wait, 10)
    late = asyncio.ensure_future(client.infer("lu", infer_inputs({"A": np.eye(2)}), timeout=1000, priority=1))
    while http.app.state.worker.depth < 1:
        await asyncio.sleep(0.01)
    with pytest.raises(InferenceServerException) as full:
        await client.infer("lu", infer_inputs({"A": np.eye(2)}))
    assert full.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    await asyncio.sleep(0.01)
    device.gate.set()
    await running
    with pytest.raises(InferenceServerException) as dropped:
        await late
    assert dropped.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert "lu_deadline_exceeded_total 1.0" in (await http.get("/metrics")).text


async def test_rpcs_at_once_are_bounded_by_what_the_memory_budget_holds_of_the_largest_messages(make_grpc):
    """grpcio receives a whole message before the servicer reserves for it: the server takes at most
    LU_MAX_INFLIGHT_BYTES / (3 x LU_MAX_REQUEST_BYTES) RPCs at once (MIN_CONCURRENT_RPCS at least), the rest
    RESOURCE_EXHAUSTED at once (32 compressed 60 MiB calls took 5.7 GB past a 512 MiB budget before)."""
    from service.grpc_server import MIN_CONCURRENT_RPCS, max_concurrent_rpcs, max_message_bytes

    http, client, _ = await make_grpc(max_request_bytes=1 << 20, max_inflight_bytes=16 << 20)
    settings = http.app.state.settings
    # 16 messages of 1 MiB at 6x would pass a 16 MiB budget: the message bound drops to 16 MiB / 96, so that
    # the floor of 16 RPCs at once fits.
    assert max_message_bytes(settings) == (16 << 20) // (MIN_CONCURRENT_RPCS * 6)
    assert max_concurrent_rpcs(settings) == MIN_CONCURRENT_RPCS
    with pytest.raises(InferenceServerException) as big:
        await client.infer("lu_factor", infer_inputs({"A": np.eye(250)}))  # 500 KB: over the message bound
    assert big.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    wide = await make_grpc(max_request_bytes=1 << 20, max_inflight_bytes=1 << 30)
    assert max_message_bytes(wide[0].app.state.settings) == 1 << 20  # LU_MAX_REQUEST_BYTES, fitting the budget
    assert max_concurrent_rpcs(wide[0].app.state.settings) == (1 << 30) // (6 * (1 << 20) + 64 * 1024)
    device = GatedDevice()
    http.app.state.worker.device = device
    calls = [asyncio.ensure_future(client.infer("lu", infer_inputs({"A": np.eye(2)}))) for _ in range(20)]
    await asyncio.to_thread(device.started.wait, 10)
    await asyncio.sleep(0.5)  # every call has reached the server: the ones past the bound are refused
    device.gate.set()
    results = await asyncio.gather(*calls, return_exceptions=True)
    refused = [r for r in results if isinstance(r, InferenceServerException)]
    assert len(refused) == 20 - MIN_CONCURRENT_RPCS, results
    assert all(r.status() == "StatusCode.RESOURCE_EXHAUSTED" for r in refused)
    for r in results:
        if not isinstance(r, Exception):
            np.testing.assert_array_equal(r.as_numpy("L"), np.eye(2))


async def test_the_grpc_deadline_bounds_the_queue_wait(make_grpc):
    http, client, _ = await make_grpc()
    device = GatedDevice()
    http.app.state.worker.device = device
    running = asyncio.ensure_future(client.infer("lu", infer_inputs({"A": np.eye(2)})))
    await asyncio.to_thread(device.started.wait, 10)
    with pytest.raises(InferenceServerException) as info:
        await client.infer("lu", infer_inputs({"A": np.eye(2)}), client_timeout=0.2)
    assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    device.gate.set()
    await running
    while http.app.state.worker.depth:  # the abandoned job is skipped, not computed
        await asyncio.sleep(0.01)
    assert 'lu_compute_seconds_count{device="cpu",operation="lu"} 1.0' in (await http.get("/metrics")).text


async def test_grpc_messages_are_reserved_against_the_in_flight_budget(make_grpc):
    http, client, stub = await make_grpc(max_inflight_bytes=96 * 1024 * 1024)
    result = await client.infer("lu_factor", infer_inputs({"A": np.eye(64)}))
    np.testing.assert_array_equal(result.as_numpy("LU"), np.eye(64))
    # 2 MB in: past the message bound that lets 16 messages at 6x fit 96 MiB (1 MiB), refused by grpcio
    # before it is parsed (and before anything could be reserved for it).
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelInfer(_request(A=("FP64", [500, 500], bytes(2_000_000))))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in info.value.details()
    held = http.app.state.budget.reserve(95 * 1024 * 1024)  # others hold most of it: this one must wait its turn
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:  # 0.5 MB in, reserved 3x: fits the budget, not what is left
            await stub.ModelInfer(_request(A=("FP64", [250, 250], bytes(500_000))))
    finally:
        held.release()
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ("lu-error-code", "overloaded") in tuple(info.value.trailing_metadata())
    assert ("retry-after", "1") in tuple(info.value.trailing_metadata())
    for _ in range(100):  # released once the calls are done
        if http.app.state.budget.in_use == 0:
            break
        await asyncio.sleep(0.01)
    assert http.app.state.budget.in_use == 0 and http.app.state.budget.peak > 64 * 64 * 8


async def _finish(call) -> None:
    """Await a unary call, or read a streaming one to its end."""
    if hasattr(call, "__aiter__"):
        async for _ in call:
            pass
    else:
        await call


async def test_the_rpcs_not_served_are_unimplemented_like_any_other_error(make_grpc, caplog):
    """Every RPC of the protocol answers: the ones this service does not serve (configuration,
    statistics, repository, shared memory, tracing, logging, streaming) UNIMPLEMENTED with the error
    code, request id, access log line and metrics of any RPC, never a logged traceback; behind the
    API key like the others."""
    from service.grpc_server import UNSERVED

    http, _, stub = await make_grpc(api_key="k")
    auth = (("authorization", "Bearer k"),)
    calls = {
        "ModelConfig": lambda md: stub.ModelConfig(pb.ModelConfigRequest(name="solve"), metadata=md),
        "ModelStatistics": lambda md: stub.ModelStatistics(pb.ModelStatisticsRequest(name="solve"), metadata=md),
        "RepositoryIndex": lambda md: stub.RepositoryIndex(pb.RepositoryIndexRequest(), metadata=md),
        # The stream is opened and read, nothing written: the server refuses it at once, without reading, and
        # a client message still being sent then loses grpcio's race (its send fails, and grpcio replaces
        # the server's status by INTERNAL "Internal error from Core"; seen once in CI).
        "ModelStreamInfer": lambda md: stub.ModelStreamInfer(metadata=md),
    }  # fmt: skip
    assert set(calls) <= set(UNSERVED)
    # Every RPC of the installed tritonclient's service is served here or refused through _serve (a newer
    # tritonclient with a new RPC fails here, instead of falling through to the base's bare refusal).
    from service.grpc_server import InferenceServicer

    rpcs = {m for m in vars(pb_grpc.GRPCInferenceServiceServicer) if not m.startswith("_")}
    assert rpcs == {m for m in vars(InferenceServicer) if m in rpcs}
    caplog.set_level("INFO")
    for method, call in calls.items():
        for metadata, code in ((auth, "not_implemented"), ((), "unauthorized")):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _finish(call(metadata))
            want = grpc.StatusCode.UNIMPLEMENTED if code == "not_implemented" else grpc.StatusCode.UNAUTHENTICATED
            assert info.value.code() == want, (method, info.value.details())
            assert ("lu-error-code", code) in tuple(info.value.trailing_metadata())
    assert not [r for r in caplog.records if r.levelno >= 30], [r.getMessage() for r in caplog.records]
    access = [r.getMessage() for r in caplog.records if r.name == "service.access"]
    assert sum("ModelConfig UNIMPLEMENTED" in m for m in access) == 1, access
    metrics = (await http.get("/metrics", headers={"authorization": "Bearer k"})).text
    assert 'endpoint="/inference.GRPCInferenceService/ModelStatistics",method="gRPC",status="UNIMPLEMENTED"' in metrics


def test_the_status_table_never_says_unknown_for_input():
    for status in (400, 401, 404, 408, 413, 415, 422, 503):
        code = grpc_status(ServiceError(status, "x", "m"))
        assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
    assert grpc_status(ServiceError(503, "shutting_down", "m")) == grpc.StatusCode.UNAVAILABLE
    assert grpc_status(ServiceError(503, "overloaded", "m")) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert set(GRPC_STATUS.values()) >= {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}


async def test_grpc_connections_are_bounded_by_lu_max_connections(make_grpc):
    """LU_MAX_CONNECTIONS holds for gRPC too: with 2, a third channel (its own connection) is refused
    (UNAVAILABLE) while two are open, and served once one closes."""
    http, _, stub = await make_grpc(max_connections=2)
    target = f"127.0.0.1:{http.app.state.grpc.port}"
    request = pb.ServerLiveRequest()
    assert (await stub.ServerLive(request)).live  # the first connection
    second = grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
    third = grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
    try:
        assert (await pb_grpc.GRPCInferenceServiceStub(second).ServerLive(request)).live
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await pb_grpc.GRPCInferenceServiceStub(third).ServerLive(request, timeout=3)
        assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        await second.close()
        await asyncio.sleep(0.3)
        assert (await pb_grpc.GRPCInferenceServiceStub(third).ServerLive(request, timeout=15, wait_for_ready=True)).live
    finally:
        await second.close()
        await third.close()
