"""Inputs an adversary would send: deep nesting, huge and zero dimensions, wrong types in every field.

Each case was a 5xx, an unbounded allocation or a huge answer to a tiny request
before the service bounded it; every one must now be a 4xx in the error model.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.service.wire import binary_request

pytestmark = pytest.mark.anyio


class Raw:
    """JSON text placed as is (the standard encoder recurses, and gives up past ~1000 levels)."""

    def __init__(self, text: str) -> None:
        self.text = text


def nested(depth: int, leaf: str = "0") -> Raw:
    return Raw("[" * depth + leaf + "]" * depth)


def dumps(value: object) -> str:
    """json.dumps that writes ``Raw`` values verbatim."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value)


def assert_4xx(r, status: int | None = None, code: str | None = None) -> dict:
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    body = r.json()
    assert set(body) >= {"error", "code", "request_id"}
    assert body["request_id"] == r.headers["x-request-id"]
    if status is not None:
        assert r.status_code == status, body
    if code is not None:
        assert body["code"] == code, body
    return body


def binary_header_only(inputs: list[dict], parameters: dict | None = None) -> tuple[bytes, dict]:
    """A binary request whose header declares tensors; the raw bytes of zero-size tensors are empty."""
    header = json.dumps({"inputs": inputs, "parameters": parameters or {}}).encode()
    return header, {"content-type": "application/octet-stream", "inference-header-content-length": str(len(header))}


def zero_input(name: str, shape: list[int], datatype: str = "FP64") -> dict:
    return {"name": name, "shape": shape, "datatype": datatype, "parameters": {"binary_data_size": 0}}


# ----------------------------------------------------------------------------- deep nesting


async def test_rank_up_to_32_is_served(client):
    r = await client.post(
        "/lu_factor", content=dumps({"A": nested(32, "2.0")}), headers={"content-type": "application/json"}
    )
    assert r.status_code == 200, r.text[:300]


@pytest.mark.parametrize("depth", [33, 65, 1000])
async def test_deeply_nested_json_tensor_is_400(client, depth):
    for path, body in [
        ("/lu_factor", {"A": nested(depth)}),
        ("/lu_factor", {"A": {"dtype": "float64", "data": nested(depth)}}),
        ("/lu_factor", {"A": {"dtype": "complex128", "data": nested(depth, "[1, 2]")}}),
        (
            "/v2/models/lu/infer",
            {"inputs": [{"name": "A", "shape": [1, 1], "datatype": "FP64", "data": nested(depth)}]},
        ),
    ]:
        assert_4xx(await client.post(path, content=dumps(body), headers={"content-type": "application/json"}))


@pytest.mark.parametrize("depth", [100, 1000])
async def test_deeply_nested_options_and_shapes_are_4xx(client, depth):
    deep = nested(depth)
    cases = [
        ("/lu_factor", {"A": [[1.0]], "pivot": deep}, 422, "invalid_option"),
        ("/lu_factor", {"A": {"shape": deep, "data": [1]}}, 400, "malformed_tensor"),
        ("/lu_factor", {"A": {"dtype": deep, "data": [1]}}, 422, "invalid_dtype"),
        ("/v2/models/lu/infer", {"inputs": [{"name": "A", "shape": deep, "datatype": "FP64", "data": [1]}]}, 400, None),
        ("/v2/models/lu/infer", {"inputs": [{"name": "A", "shape": [1, 1], "datatype": deep, "data": [1]}]}, 400, None),
        (
            "/v2/models/lu/infer",
            {"inputs": [{"name": deep, "shape": [1, 1], "datatype": "FP64", "data": [1]}]},
            400,
            None,
        ),
        ("/v2/models/lu/infer", {"inputs": [], "parameters": {"pivot": deep}}, 422, None),
        ("/v2/models/lu/infer", {"inputs": [], "id": deep}, 400, None),
    ]
    for path, body, status, code in cases:
        r = await client.post(path, content=dumps(body), headers={"content-type": "application/json"})
        assert_4xx(r, status, code)
        assert len(r.content) < 4096  # the message quotes a bounded excerpt, not the whole value


async def test_dimensions_beyond_64_bits_are_400(client):
    body, headers = binary_header_only([zero_input("A", [0, 1 << 64, 1 << 64])])
    assert_4xx(await client.post("/lu_factor", content=body, headers=headers), 400, "malformed_tensor")


async def test_deeply_nested_binary_header_is_4xx(client):
    header = dumps({"inputs": [{"name": "A", "shape": nested(500), "datatype": "FP64"}]}).encode()
    r = await client.post(
        "/lu_factor",
        content=header,
        headers={"content-type": "application/octet-stream", "inference-header-content-length": str(len(header))},
    )
    assert_4xx(r, 400)


async def test_a_binary_request_that_is_all_json_header_is_held_to_the_json_bounds(make_client):
    """A binary request whose Inference-Header-Content-Length is the whole body was parsed as JSON under
    the binary bounds: LU_MAX_REQUEST_BYTES instead of LU_MAX_JSON_BYTES, and 3x its bytes reserved where
    nested lists take 44x (64 MiB of it peaked at 3.2 GiB over a 1 GiB budget, found by a helper's audit)."""
    deep = "[" * 300 + "]" * 300
    header = ('{"inputs": [], "parameters": {"x": [' + ",".join([deep] * 200) + "]}}").encode()  # 120 KB
    headers = {"content-type": "application/octet-stream", "inference-header-content-length": str(len(header))}
    small_json = await make_client(max_json_bytes=100_000)
    body = assert_4xx(await small_json.post("/v2/models/lu_factor/infer", content=header, headers=headers), 413)
    assert body["code"] == "request_too_large" and "LU_MAX_JSON_BYTES = 100000" in body["error"]
    # Within LU_MAX_JSON_BYTES but not within the budget once its lists are counted (about 5 MB for the
    # parse against 0.4 MB at the binary factor): refused before it is parsed.
    tight = await make_client(max_inflight_bytes=2_000_000)
    body = assert_4xx(await tight.post("/v2/models/lu_factor/infer", content=header, headers=headers), 413)
    assert "the parsed JSON" in body["error"]
    state = tight.app.state
    assert state.budget.in_use == state.bodies.held_bytes  # nothing held back but the idle receive buffers
    for client in (small_json, tight):  # the same service still answers an ordinary binary request
        ok, ok_headers = binary_request({"A": np.eye(3)})
        assert (await client.post("/lu_factor", content=ok, headers=ok_headers)).status_code == 200


# ----------------------------------------------------------------------------- zero-size work


@pytest.mark.parametrize(
    ("path", "inputs"),
    [
        ("/lu_factor", [zero_input("A", [1 << 27, 0, 0])]),
        ("/lu", [zero_input("A", [1 << 27, 0, 0])]),
        ("/lu_unpack", [zero_input("LU", [1 << 27, 0, 0]), zero_input("pivots", [1 << 27, 0], "INT32")]),
        (
            "/lu_solve",
            [zero_input("LU", [1, 0, 0]), zero_input("pivots", [1, 0], "INT32"), zero_input("B", [1 << 29, 0, 0])],
        ),
        ("/solve", [zero_input("A", [1 << 27, 0, 0]), zero_input("B", [1 << 27, 0, 0])]),
        ("/lu_factor", [zero_input("A", [0, 1 << 62, 1 << 62])]),
        ("/lu_factor", [zero_input("A", [0, 1 << 63, 4])]),
        ("/lu_factor", [zero_input("A", [1 << 20, 1 << 20, 0])]),
    ],
)
async def test_zero_size_tensors_do_not_escape_the_element_bound(client, path, inputs):
    body, headers = binary_header_only(inputs)
    assert_4xx(await client.post(path, content=body, headers=headers), 413, "too_many_elements")


async def test_broadcast_batch_of_empty_matrices_is_bounded(client):
    # Each input is small; the broadcast batch (2^14 x 2^15 = 2^29) is what the answer would hold.
    inputs = [
        zero_input("LU", [1 << 14, 1, 0, 0]),
        zero_input("pivots", [1 << 14, 1, 0], "INT32"),
        zero_input("B", [1, 1 << 15, 0, 0]),
    ]
    body, headers = binary_header_only(inputs)
    assert_4xx(await client.post("/lu_solve", content=body, headers=headers), 422, "output_too_large")
    inputs = [zero_input("A", [1 << 14, 1, 0, 0]), zero_input("B", [1, 1 << 15, 0, 3])]
    body, headers = binary_header_only(inputs)
    assert_4xx(await client.post("/solve", content=body, headers=headers), 422, "output_too_large")


@pytest.mark.parametrize("shape", [[0, 1 << 62, 1 << 62], [1 << 63, 0], [-1, 2]])
async def test_json_declared_shapes_with_huge_dimensions_are_4xx(client, shape):
    r = await client.post("/lu_factor", json={"A": {"dtype": "float64", "shape": shape, "data": []}})
    assert_4xx(r)
    r = await client.post(
        "/v2/models/lu/infer", json={"inputs": [{"name": "A", "shape": shape, "datatype": "FP64", "data": []}]}
    )
    assert_4xx(r)


async def test_empty_work_within_the_bound_still_works(client):
    body, headers = binary_request({"A": np.zeros((3, 0, 0))})
    r = await client.post("/lu_factor", content=body, headers=headers)
    assert r.status_code == 200, r.text


# ----------------------------------------------------------------------------- wrong JSON types in every field


WRONG = [None, True, 1, 1.5, "x", [], {}, [1, [2]], {"a": {"b": 1}}]


@pytest.mark.parametrize("value", WRONG)
async def test_wrong_types_in_every_v2_field(client, value):
    good = {"name": "A", "shape": [1, 1], "datatype": "FP64", "data": [2.0]}
    bodies = [
        {"inputs": value},
        {"inputs": [value]},
        {"inputs": [{**good, "name": value}]},
        {"inputs": [{**good, "shape": value}]},
        {"inputs": [{**good, "datatype": value}]},
        {"inputs": [{**good, "data": value}]},
        {"inputs": [{**good, "parameters": value}]},
        {"inputs": [good], "parameters": value},
        {"inputs": [good], "outputs": value},
        {"inputs": [good], "outputs": [value]},
        {"inputs": [good], "outputs": [{"name": "P", "parameters": value}]},
        {"inputs": [good], "outputs": [{"name": "P", "parameters": {"binary_data": value}}]},
        {"inputs": [good], "id": value},
        {"inputs": [good], "parameters": {"pivot": value}},
        {"inputs": [good], "parameters": {"binary_data_output": value}},
    ]
    for body in bodies:
        r = await client.post("/v2/models/lu/infer", json=body)
        assert r.status_code < 500, (body, r.text[:300])
        if r.status_code != 200:
            assert_4xx(r)


@pytest.mark.parametrize("value", WRONG)
async def test_wrong_types_in_every_native_field(client, value):
    bodies = [
        {"A": value},
        {"A": {"dtype": value, "data": [[1.0]]}},
        {"A": {"shape": value, "data": [[1.0]]}},
        {"A": {"data": value}},
        {"A": [[1.0]], "pivot": value},
        {"A": [[value]]},
    ]
    for body in bodies:
        r = await client.post("/lu", json=body)
        assert r.status_code < 500, (body, r.text[:300])
        if r.status_code != 200:
            assert_4xx(r)


@pytest.mark.parametrize("value", WRONG)
async def test_wrong_types_in_binary_header_fields(client, value):
    good = {"name": "A", "shape": [1, 1], "datatype": "FP64", "parameters": {"binary_data_size": 8}}
    for entry in [
        {**good, "shape": value},
        {**good, "datatype": value},
        {**good, "parameters": value},
        {**good, "parameters": {"binary_data_size": value}},
        {**good, "name": value},
    ]:
        header = json.dumps({"inputs": [entry]}).encode()
        r = await client.post(
            "/lu",
            content=header + np.ones(1).tobytes(),
            headers={"content-type": "application/octet-stream", "inference-header-content-length": str(len(header))},
        )
        assert r.status_code < 500, (entry, r.text[:300])
        if r.status_code != 200:
            assert_4xx(r)


# ----------------------------------------------------------------------------- non-finite and out of range


async def test_nonfinite_and_huge_numbers_in_json(client):
    for data in ([[1e400]], [["NaN"]], [[-1e308 * 10]], [[10**400]], [[2**64]]):
        r = await client.post(
            "/lu",
            content=json.dumps({"A": data}).replace("Infinity", "1e400"),
            headers={"content-type": "application/json"},
        )
        assert r.status_code < 500, (data, r.text)


@pytest.mark.parametrize("path", ["/solve", "/v2/models/solve/infer"])
async def test_a_long_string_among_numbers_is_400_without_a_text_array(client, path):
    """20,000 zeros and one 20,000-character string (60 kB; gzipped, about 120 bytes): NumPy made a text array
    as wide as the string for every element (1.6 GB), or a 500 where it could not. Now a 400 naming the
    string, and the codec's peak stays near the body's own size."""
    data = "[" + "0," * 20000 + '"' + "x" * 20000 + '"]'
    if path == "/solve":
        body = '{"A": ' + data + ', "B": [1]}'
    else:
        body = json.dumps({"inputs": [{"name": "A", "shape": [20001], "datatype": "FP64", "data": "@"}]})
        body = body.replace('"@"', data)
    r = await client.post(path, content=body, headers={"content-type": "application/json"})
    assert "is not a number" in assert_4xx(r, 400, "malformed_tensor")["error"]


def test_the_codec_never_builds_a_text_array():
    """The same in the codec, measured: the peak of decoding 5,000 numbers beside one 5,000-character string
    (a 100 MB text array before) and of numbers beside the non-finite spellings."""
    import tracemalloc

    from service.codec import _numbers
    from service.errors import ServiceError

    tracemalloc.start()
    try:
        with pytest.raises(ServiceError, match="is not a number"):
            _numbers("A", [0] * 5000 + ["x" * 5000])
        assert tracemalloc.get_traced_memory()[1] < 2 << 20
        tracemalloc.reset_peak()
        arr = _numbers("A", [[0.5] * 100 for _ in range(300)] + [["NaN", "Infinity", "-Infinity"] + [1] * 97])
        assert tracemalloc.get_traced_memory()[1] < 2 << 20  # a text array: 30100 x 32 x 4 = 3.9 MB beside
        tracemalloc.reset_peak()
        with pytest.raises(ServiceError, match="is not a number"):  # a string where lists are: not taken apart
            _numbers("A", [[[[0]]], "\u0100" * 1_000_000])  # (characters past Latin-1: a new str each, ~76 bytes)
        assert tracemalloc.get_traced_memory()[1] < 8 << 20  # 86 MB with the first check of the sums
    finally:
        tracemalloc.stop()
    assert arr.dtype == np.float64 and arr.shape == (301, 100) and np.isnan(arr[300, 0]) and arr[300, 2] == -np.inf


@pytest.mark.parametrize(
    "data",
    [
        [[1, "2"], [3, 4]],
        [[1, None], [3, 4]],
        [[1, {"a": 1}], [3, 4]],
        [[1, [2]], [3, 4]],
        [[1, 2], 3],
        [[True, False]],
    ],
)
async def test_non_numbers_anywhere_in_json_data_are_400(client, data):
    assert_4xx(await client.post("/lu_factor", json={"A": data}), 400, "malformed_tensor")


# ----------------------------------------------------------------------------- 500s carry the request id


async def test_a_bug_answers_500_with_the_request_id(make_client):
    client = await make_client(raise_app_exceptions=False)

    def broken(t, o):
        raise RuntimeError("a bug")

    from service.operations import OPERATIONS

    op = OPERATIONS["lu"]
    original = op.compute
    object.__setattr__(op, "compute", broken)
    try:
        r = await client.post("/lu", json={"A": [[1.0]]}, headers={"x-request-id": "bug-123"})
    finally:
        object.__setattr__(op, "compute", original)
    assert r.status_code == 500
    assert r.headers["x-request-id"] == "bug-123"
    assert r.json() == {
        "error": "internal server error; see the server log",
        "code": "internal_error",
        "request_id": "bug-123",
    }
    assert "RuntimeError" not in r.text
