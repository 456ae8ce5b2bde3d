"""The error model: every bad input gets its status, a stable code and the request id; never a 500."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.service.wire import binary_request

pytestmark = pytest.mark.anyio

A2 = [[3.0, 1.0], [1.0, 2.0]]


def assert_error(r, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == code, body
    assert body["request_id"] == r.headers["x-request-id"]
    assert isinstance(body["error"], str) and body["error"]
    return body


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/lu_factor", b"{", 400, "malformed_json"),
        ("/lu_factor", b"[1, 2]", 400, "malformed_body"),
        ("/lu_factor", b'{"A": [[1, 2], [3]]}', 400, "malformed_tensor"),
        ("/lu_factor", b'{"A": [[1, "x"], [3, 4]]}', 400, "malformed_tensor"),
        ("/lu_factor", b'{"A": [[1, "1.5"], [3, 4]]}', 400, "malformed_tensor"),
        ("/lu_factor", b'{"A": [[true, false], [false, true]]}', 400, "malformed_tensor"),
        ("/lu_factor", b'{"A": [[1, null], [3, 4]]}', 400, "malformed_tensor"),
        ("/lu_factor", b'{"A": "abc"}', 400, "malformed_tensor"),
        ("/lu_factor", b'{"A": {"shape": [2, 2], "data": [1, 2, 3]}}', 400, "shape_mismatch"),
        ("/det", b'{"A": {"shape": [2, 2], "data": [[1, 2, 3, 4]]}}', 400, "shape_mismatch"),  # nested otherwise
        ("/det", b'{"A": {"shape": [2, 2], "data": [[1, 2], [3, 4], [5, 6]]}}', 400, "shape_mismatch"),
        ("/det", b'{"A": {"shape": [4, 1], "data": [[1, 2], [3, 4]]}}', 400, "shape_mismatch"),
        ("/lu_rcond", b'{"LU": [[3, 4], [0.5, 1]], "pivots": [2, 2], "anorm": "many"}', 400, "malformed_tensor"),
        ("/lu_factor", b'{"A": {"shape": [2, -2], "data": []}}', 400, "malformed_tensor"),
        ("/lu_factor", b'{"A": {"data": [1], "extra": 1}}', 400, "malformed_tensor"),
        ("/lu_factor", b'{"A": {"shape": [2, 2]}}', 400, "malformed_tensor"),
        ("/lu_factor", b'{"A": {"dtype": "complex128", "shape": [1, 1], "data": [[1]]}}', 400, "malformed_tensor"),
        ("/lu_factor", b'{"A": {"dtype": "float16", "data": [[1]]}}', 422, "invalid_dtype"),
        ("/lu_factor", b'{"A": [1, 2, 3]}', 422, "invalid_shape"),
        ("/lu_factor", b"{}", 422, "missing_input"),
        ("/lu_factor", b'{"A": [[1]], "pivot": "yes"}', 422, "invalid_option"),
        ("/lu_factor", b'{"A": [[1]], "pivto": true}', 422, "unknown_option"),
        ("/lu_solve", b'{"LU": [[1, 0], [0, 1]], "pivots": [1, 2], "B": [[1], [2], [3]]}', 422, "invalid_shape"),
        ("/lu_solve", b'{"LU": [[1, 0], [0, 1]], "pivots": [0, 2], "B": [[1], [2]]}', 422, "invalid_pivots"),
        ("/lu_solve", b'{"LU": [[1, 0], [0, 1]], "pivots": [1.5, 2], "B": [[1], [2]]}', 422, "invalid_dtype"),
        ("/lu_unpack", b'{"LU": [[1, 0], [0, 1]], "pivots": [99999999999, 2]}', 422, "invalid_pivots"),
        ("/lu_unpack", b'{"LU": [[1, 0], [0, 1]], "pivots": {"dtype": "int32", "data": [3e9, 1]}}', 400, "malformed_tensor"),
        ("/solve", b'{"A": [[1, 2], [3, 4]], "B": [[1, 2], [3, 4]], "adjoint": true}', 422, "unknown_option"),
        ("/v2/models/solve/infer", b'{"inputs": 3}', 400, "malformed_body"),
        ("/v2/models/solve/infer", b'{"inputs": [{"name": "A", "shape": [1], "datatype": "FP64"}]}', 400, "malformed_tensor"),
        ("/v2/models/lu/infer", b'{"inputs": [{"name": "A", "shape": [1, 1], "datatype": "STR", "data": [1]}]}', 422, "invalid_dtype"),
        ("/v2/models/lu/infer", b'{"inputs": [{"name": "A", "shape": [1, 1], "datatype": "BOOL", "data": [true]}]}', 422, "invalid_dtype"),  # as binary
        ("/v2/models/lu/infer", b'{"inputs": [{"name": "Z", "shape": [1, 1], "datatype": "FP64", "data": [1]}]}', 422, "unknown_input"),
        ("/v2/models/lu/infer", b'{"inputs": [], "outputs": [{"name": "X"}]}', 400, "unknown_output"),
        ("/v2/models/lu/infer", b'{"inputs": [], "id": 5}', 400, "malformed_body"),
    ],
)  # fmt: skip
async def test_malformed_and_invalid_bodies(client, path, body, status, code):
    r = await client.post(path, content=body, headers={"content-type": "application/json"})
    assert_error(r, status, code)


async def test_a_number_past_float64_is_named_not_called_invalid_json(client):
    """1e400 is valid JSON that no float64 holds (the parser refuses it): the message says so."""
    for body in (
        b'{"A": [[1e400]]}',
        b'{"inputs": [{"name": "A", "shape": [1, 1], "datatype": "FP64", "data": [-1e400]}]}',
    ):
        path = "/det" if body.startswith(b'{"A"') else "/v2/models/det/infer"
        r = await client.post(path, content=body, headers={"content-type": "application/json"})
        error = assert_error(r, 400, "malformed_json")["error"]
        assert "past float64's range" in error and '"Infinity"' in error and "not valid JSON" not in error


def test_error_messages_are_capped_in_utf8_bytes():
    from service.errors import MAX_MESSAGE, ServiceError

    for text in ("x" * 5000, "\u00e9" * 5000, "\U0001f600" * 700, "short"):
        message = ServiceError(400, "c", text).message
        assert len(message.encode()) <= MAX_MESSAGE and text.startswith(message.removesuffix("...")[:10])
    assert ServiceError(400, "c", "short").message == "short"


async def test_nested_data_as_triton_on_v2_and_as_declared_natively(client):
    """/v2 JSON counts a tensor's elements whatever its nesting (Triton walks nested data in row-major
    order); the native object form wants the nesting declared (up to dimensions of one)."""
    v2 = {"inputs": [{"name": "A", "shape": [2, 2], "datatype": "FP64", "data": [[3, 1, 1, 2]]}]}
    r = await client.post("/v2/models/det/infer", json=v2)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [pytest.approx(5.0)], r.text
    r = await client.post("/det", json={"A": {"shape": [1, 2, 2], "data": [[3, 1], [1, 2]]}})
    assert r.status_code == 200 and r.json()["det"]["data"] == [pytest.approx(5.0)], r.text


async def test_singular_systems_are_422_with_indices(client):
    A = np.stack([np.eye(2), np.zeros((2, 2)), np.eye(2)]).tolist()
    body = assert_error(await client.post("/solve", json={"A": A, "B": [1.0, 1.0]}), 422, "singular_matrix")
    assert body["indices"] == [[1]] and body["info"] == [1]
    LU = [[[1.0, 0.0], [0.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]]]
    piv = [[1, 2], [1, 2]]
    body = assert_error(
        await client.post("/lu_solve", json={"LU": LU, "pivots": piv, "B": [[1.0], [1.0]]}), 422, "singular_matrix"
    )
    assert body["indices"] == [[0]] and body["info"] == [2]
    r = await client.post("/lu_solve", json={"LU": LU, "pivots": piv, "B": [[1.0], [1.0]], "check_errors": False})
    assert r.status_code == 200
    r = await client.post("/lu_factor", json={"A": [[0.0, 0.0], [0.0, 0.0]]})
    assert r.status_code == 200 and r.json()["info"]["data"] == 1


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda h, b: ({**h, "inference-header-content-length": "abc"}, b), "malformed_header"),
        (lambda h, b: ({**h, "inference-header-content-length": "0"}, b), "malformed_header"),
        # What int() takes but a byte count is not: these slipped past the JSON header's bound and reservation
        # ("+N"), or made them fail (a 500 for "²" or 5000 digits).
        (
            lambda h, b: ({**h, "inference-header-content-length": "+" + h["inference-header-content-length"]}, b),
            "malformed_header",
        ),
        (lambda h, b: ({**h, "inference-header-content-length": "1_0"}, b), "malformed_header"),
        (lambda h, b: ({**h, "inference-header-content-length": "²".encode("latin-1")}, b), "malformed_header"),
        (lambda h, b: ({**h, "inference-header-content-length": "9" * 5000}, b), "malformed_header"),
        (lambda h, b: ({**h, "inference-header-content-length": str(len(b) + 1)}, b), "malformed_header"),
        (lambda h, b: (h, b[:-8]), "truncated_body"),
        (lambda h, b: (h, b + b"\0" * 8), "malformed_body"),
    ],
)
async def test_binary_framing_errors(client, mutate, code):
    body, headers = binary_request({"A": np.eye(3)})
    headers, body = mutate(headers, body)
    assert_error(await client.post("/lu_factor", content=body, headers=headers), 400, code)


@pytest.mark.parametrize("path", ["/lu_factor", "/v2/models/lu_factor/infer"])
async def test_a_repeated_binary_header_must_repeat_one_value(client, path):
    body, headers = binary_request({"A": np.eye(3)})
    hlen = headers["inference-header-content-length"]
    base = [(k, v) for k, v in headers.items() if k != "inference-header-content-length"]
    same = [*base, ("inference-header-content-length", hlen), ("Inference-Header-Content-Length", f" {hlen}")]
    r = await client.post(path, content=body, headers=same)
    assert r.status_code == 200, r.text
    for second in (str(int(hlen) - 1), "abc", "9" * 5000):
        differ = [*base, ("inference-header-content-length", hlen), ("inference-header-content-length", second)]
        err = assert_error(await client.post(path, content=body, headers=differ), 400, "malformed_header")
        assert "more than once" in err["error"] and len(err["error"]) < 400


async def test_octet_stream_without_the_header_is_json(client):
    # tritonclient.http.aio sends its JSON bodies as application/octet-stream (Triton's rule: JSON).
    r = await client.post(
        "/solve", content=b'{"A": [[2.0]], "B": [4.0]}', headers={"content-type": "application/octet-stream"}
    )
    assert r.status_code == 200 and r.json()["X"]["data"] == [2.0]
    body, _ = binary_request({"A": np.eye(3)})
    assert_error(
        await client.post("/lu_factor", content=body, headers={"content-type": "application/octet-stream"}),
        400,
        "malformed_json",
    )


async def test_binary_size_must_match_shape(client):
    body, headers = binary_request({"A": np.eye(3)})
    hlen = int(headers["inference-header-content-length"])
    header = json.loads(body[:hlen])
    header["inputs"][0]["shape"] = [3, 2]
    new = json.dumps(header).encode()
    r = await client.post(
        "/lu_factor", content=new + body[hlen:], headers={**headers, "inference-header-content-length": str(len(new))}
    )
    assert_error(r, 400, "shape_mismatch")


async def test_unsupported_content_type_is_415(client):
    r = await client.post("/solve", content=b"A=1", headers={"content-type": "application/x-www-form-urlencoded"})
    assert_error(r, 415, "unsupported_media_type")


async def test_unknown_route_and_method(client):
    assert_error(await client.post("/qr", json={}), 404, "not_found")
    assert_error(await client.get("/solve"), 405, "method_not_allowed")


async def test_content_length_over_limit_is_413_before_reading(make_client):
    client = await make_client(max_request_bytes=1000)
    read = []

    async def body():
        read.append(1)
        yield b"x" * 10

    r = await client.post(
        "/solve", content=body(), headers={"content-length": "5000", "content-type": "application/json"}
    )
    assert_error(r, 413, "request_too_large")
    assert read == []  # the body was never pulled


async def test_streamed_body_over_limit_is_413(make_client):
    client = await make_client(max_request_bytes=1000)

    async def chunks():
        for _ in range(100):
            yield b" " * 100

    r = await client.post("/solve", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert_error(r, 413, "request_too_large")


async def test_declared_elements_over_limit_is_413(make_client, rng):
    client = await make_client(max_elements=100)
    assert_error(await client.post("/lu_factor", json={"A": {"shape": [11, 10], "data": []}}), 413, "too_many_elements")
    body, headers = binary_request({"A": rng.standard_normal((11, 10))})
    assert_error(await client.post("/lu_factor", content=body, headers=headers), 413, "too_many_elements")
    r = await client.post("/lu_factor", json={"A": np.zeros((11, 10)).tolist()})
    assert_error(r, 413, "too_many_elements")


async def test_output_bound_is_checked_before_computing(make_client):
    client = await make_client(max_elements=10_000)
    # A 5000 x 1 matrix is 5000 elements in, but its P would be 25 million out.
    r = await client.post("/lu", json={"A": {"shape": [5000, 1], "data": [1.0] * 5000}})
    assert_error(r, 422, "output_too_large")
    r = await client.post(
        "/lu_solve",
        json={"LU": {"shape": [50, 1, 2, 2], "data": [1.0] * 200}, "pivots": {"shape": [50, 1, 2], "data": [1] * 100},
              "B": {"shape": [1, 60, 2, 2], "data": [1.0] * 240}},
    )  # fmt: skip
    assert_error(r, 422, "output_too_large")


async def test_request_id_is_echoed_or_generated(client):
    r = await client.get("/healthz", headers={"x-request-id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    r = await client.post("/lu_factor", content=b"{", headers={"x-request-id": "bad id\twith space"})
    assert r.headers["x-request-id"] != "bad id\twith space" and len(r.headers["x-request-id"]) == 32
    assert r.json()["request_id"] == r.headers["x-request-id"]


async def test_api_key(make_client):
    client = await make_client(api_key="first-key, second-key")
    for path in ("/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"):
        assert (await client.get(path)).status_code == 200
    for method, path in (("POST", "/solve"), ("GET", "/v2"), ("GET", "/v2/models/lu"), ("GET", "/metrics")):
        r = await client.request(method, path, json={"A": A2, "B": [1.0, 1.0]})
        assert_error(r, 401, "unauthorized")
        assert r.headers["www-authenticate"] == "Bearer"
        r = await client.request(
            method, path, json={"A": A2, "B": [1.0, 1.0]}, headers={"authorization": "Bearer nope"}
        )
        assert_error(r, 401, "unauthorized")
        for key in ("first-key", "second-key"):
            r = await client.request(
                method, path, json={"A": A2, "B": [1.0, 1.0]}, headers={"authorization": f"Bearer {key}"}
            )
            assert r.status_code == 200, r.text
    r = await client.post("/v2/models/lu/infer", json={"inputs": []}, headers={"authorization": "Basic first-key"})
    assert_error(r, 401, "unauthorized")


async def test_every_made_up_request_id_comes_from_one_helper(client, monkeypatch):
    """The middleware's ids and those of the protocol's own refusals (408, 431, 400 before any request
    object exists) are made alike: 128 random bits in hex."""
    import service.context
    from service.protocol import _client_request_id, _error_bytes

    monkeypatch.setattr(service.context, "getrandbits", lambda k: int.from_bytes(bytes(range(k // 8)), "big"))
    made = bytes(range(16)).hex()
    r = await client.post("/lu_factor", content=b"{")
    assert r.headers["x-request-id"] == r.json()["request_id"] == made
    refusal = _error_bytes(408, "request_timeout", "slow", _client_request_id(None))
    head, _, body = refusal.partition(b"\r\n\r\n")
    assert json.loads(body)["request_id"] == made and f"x-request-id: {made}".encode() in head
    given = [(b"Host", b"x"), (b"X-Request-ID", b"trace-9")]
    assert _client_request_id(given) == "trace-9"  # the client's, where its headers got that far
    assert _client_request_id([(b"x-request-id", b"bad id\x00")]) == made  # not well-formed: a new one
