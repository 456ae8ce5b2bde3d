"""The client against a server that answers wrongly: malformed, lying, oversized, redirecting.

Every such answer is a documented ``lu_client`` error (mostly :class:`APIResponseValidationError`),
never a bare ``KeyError``/``ValueError``, wrong numbers, a hang or an allocation the answer's own bytes
do not justify. The answers come from a raw socket server, so that httpx's real streaming path runs
(``Content-Length``, chunked, gzip), for the sync and the async client alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import resource
import socket
import threading
import tracemalloc
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest

import lu_client
from lu_client import APIResponseValidationError, AsyncLUClient, LUClient
from lu_client._split import Limits, split


class RawServer:
    """Answers every request with ``respond(i)`` (the i-th request's whole raw answer), then closes."""

    def __init__(self, respond: Callable[[int], bytes]) -> None:
        self.respond = respond
        self.count = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = bytearray()
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, rest = bytes(data).split(b"\r\n\r\n", 1)
            rest = bytearray(rest)
            length = next(
                (
                    int(v)
                    for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n"))
                    if k.lower() == b"content-length"
                ),
                0,
            )
            while len(rest) < length:
                rest += conn.recv(65536)
            index, self.count = self.count, self.count + 1
            with contextlib.suppress(OSError):  # the client hung up (it refused the answer early)
                conn.sendall(self.respond(index))


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[int], bytes]], RawServer]]:
    servers: list[RawServer] = []

    def start(respond: Callable[[int], bytes]) -> RawServer:
        servers.append(RawServer(respond))
        return servers[-1]

    yield start
    for server in servers:
        server.sock.close()


def http(status: int = 200, body: bytes = b"", headers: dict[str, str] | None = None, length: bool = True) -> bytes:
    fields = {"Connection": "close", **(headers or {})}
    if length:
        fields.setdefault("Content-Length", str(len(body)))
    return (
        f"HTTP/1.1 {status} X\r\n".encode()
        + "".join(f"{k}: {v}\r\n" for k, v in fields.items()).encode()
        + b"\r\n"
        + body
    )


def binary(outputs: object, blobs: bytes, hlen: str | None = None) -> bytes:
    header = json.dumps({"outputs": outputs}).encode()
    length = str(len(header)) if hlen is None else hlen
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": length}
    return http(200, header + blobs, headers)


def det_output(shape: object = None, datatype: str = "FP64", size: object = 16, name: str = "det") -> dict:
    return {
        "name": name,
        "shape": [2] if shape is None else shape,
        "datatype": datatype,
        "parameters": {"binary_data_size": size},
    }


def json_answer(body: object) -> bytes:
    return http(
        200, body if isinstance(body, bytes) else json.dumps(body).encode(), {"Content-Type": "application/json"}
    )


TWO = np.eye(2)[None].repeat(2, 0)  # two 2x2 matrices: det answers 2 float64
F64 = np.array([1.0, 4.0]).tobytes()

BINARY_LIES = {
    "too few bytes": binary([det_output()], F64[:8]),
    "unknown datatype": binary([det_output(datatype="FP8")], F64),
    "string datatype": binary([det_output(datatype="BYTES")], F64),
    "header length not a number": binary([det_output()], F64, hlen="abc"),
    "header length past the body": binary([det_output()], F64, hlen="100000"),
    "header length negative": binary([det_output()], F64, hlen="-5"),
    "header length of 5000 digits": binary([det_output()], F64, hlen="1" * 5000),
    "negative dimension": binary([det_output(shape=[-1])], F64 + F64),
    "fractional dimension": binary([det_output(shape=[2.5])], F64),
    "boolean dimension": binary([det_output(shape=[True, 2])], F64),
    "huge dimension": binary([det_output(shape=[2**40], size=2**43)], F64),
    "null shape": binary([det_output(shape="x")], F64),
    "outputs not a list": binary({"det": 1}, F64),
    "output without a name": binary([{"shape": [2], "datatype": "FP64"}], F64),
    "size that is not the shape's": binary([det_output(size=8), det_output(name="x", shape=[1], size=8)], F64),
    "size as a string": binary([det_output(size="16")], F64),
    "bytes after the last output": binary([det_output()], F64 + b"garbage"),
    "header not JSON": http(200, b"{nope" + F64, {"Inference-Header-Content-Length": "5"}),
    "an output twice": binary([det_output(), det_output(size=0, shape=[0])], F64),
    "the output missing": binary([], b""),
}

JSON_LIES = {
    "an error body with 200": {"error": "boom", "code": "internal"},
    "ragged data": {"det": {"dtype": "float64", "shape": [2], "data": [[1], [1, 2]]}},
    "an object dtype": {"det": {"dtype": "object", "shape": [2], "data": [{}, "x"]}},
    "a huge string dtype": {"det": {"dtype": "S500000000", "shape": [2], "data": [1, 2]}},
    "a subarray dtype": {"det": {"dtype": "(100000,100000)f8", "shape": [2], "data": [1, 2]}},
    "a unicode dtype": {"det": {"dtype": "<U5", "shape": [2], "data": ["a", "b"]}},
    "a missing dtype": {"det": {"shape": [2], "data": [1, 2]}},
    "a number past float64": {"det": {"dtype": "int64", "shape": [2], "data": [10**400, 1]}},
    "data that is not the shape's": {"det": {"dtype": "float64", "shape": [3], "data": [1, 2]}},
    "a null output": {"det": None},
    "a list body": [1, 2],
    "an OIP answer with an unknown datatype": {
        "outputs": [{"name": "det", "datatype": "FP8", "shape": [2], "data": [1, 2]}]
    },
    "an OIP answer whose outputs are not objects": {"outputs": [1]},
    "a null among floats": {"det": {"dtype": "float64", "shape": [2], "data": [None, 1.0]}},
    "null data": {"det": {"dtype": "float64", "shape": [], "data": None}},
    "booleans among floats": {"det": {"dtype": "float64", "shape": [2], "data": [True, False]}},
    "numbers as strings": {"det": {"dtype": "float64", "shape": [2], "data": ["1e3", "7"]}},
    "a fraction for an integer": {"det": {"dtype": "int32", "shape": [1], "data": [1.7]}},
    "a string for a boolean": {"det": {"dtype": "bool", "shape": [1], "data": ["abc"]}},
}


def _sync(url: str, **kwargs: object) -> LUClient:
    return LUClient(url, max_retries=0, timeout=10, **kwargs)


def _run_both(url: str, call: Callable, **kwargs: object) -> list[BaseException | object]:
    """``call(client)`` with the sync client and the async twin; what each returned or raised."""
    results: list[BaseException | object] = []
    with _sync(url, **kwargs) as client:
        try:
            results.append(call(client))
        except BaseException as exc:
            results.append(exc)

    async def go() -> None:
        async with AsyncLUClient(url, max_retries=0, timeout=10, **kwargs) as client:
            try:
                results.append(await call(client))
            except BaseException as exc:
                results.append(exc)

    asyncio.run(go())
    return results


@pytest.mark.parametrize("name", sorted(BINARY_LIES))
def test_a_lying_binary_answer_is_a_validation_error(serve, name):
    server = serve(lambda _: BINARY_LIES[name])
    for result in _run_both(server.url, lambda c: c.det(TWO)):
        assert isinstance(result, APIResponseValidationError), (name, result)
        assert "malformed" in str(result)


@pytest.mark.parametrize("name", sorted(JSON_LIES))
def test_a_lying_json_answer_is_a_validation_error(serve, name):
    server = serve(lambda _: json_answer(JSON_LIES[name]))
    for result in _run_both(server.url, lambda c: c.det(TWO), binary=False):
        assert isinstance(result, APIResponseValidationError), (name, result)


def test_json_nested_past_the_parser_is_a_validation_error(serve):
    deep = b'{"det":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    server = serve(lambda _: json_answer(deep))
    for result in _run_both(server.url, lambda c: c.det(TWO), binary=False):
        assert isinstance(result, APIResponseValidationError)


def test_non_json_answers_are_validation_errors(serve):
    server = serve(lambda _: http(200, b"<html>proxy</html>", {"Content-Type": "text/html"}))
    for result in _run_both(server.url, lambda c: c.det(TWO)):
        assert isinstance(result, APIResponseValidationError)


@pytest.mark.parametrize("status", [301, 307, 204])
def test_a_redirect_or_an_empty_success_is_not_an_answer(serve, status):
    server = serve(lambda _: http(status, b"", {"Location": "/elsewhere"}))
    for result in _run_both(server.url, lambda c: c.det(TWO)):
        assert isinstance(result, APIResponseValidationError)
        assert status == 204 or str(status) in str(result)  # a 204's empty body is no answer either


def test_null_info_from_lu_factor_is_a_validation_error(serve):
    body = {
        "LU": {"dtype": "float64", "shape": [2, 2], "data": [[1, 0], [0, 1]]},
        "pivots": {"dtype": "int32", "shape": [2], "data": [1, 2]},
        "info": None,
    }
    server = serve(lambda _: json_answer(body))
    for call in (lambda c: c.lu_factor(np.eye(2)), lambda c: c.lu_factor_ex(np.eye(2))):
        for result in _run_both(server.url, call, binary=False):
            assert isinstance(result, APIResponseValidationError)


def test_a_declared_length_past_what_the_call_can_need_is_refused_before_reading(serve):
    server = serve(lambda _: http(200, b"0123456789", {"Content-Length": str(2**40)}))
    tracemalloc.start()
    try:
        for result in _run_both(server.url, lambda c: c.det(TWO)):
            assert isinstance(result, APIResponseValidationError)
            assert "more than" in str(result)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20


def test_a_declared_length_not_sent_costs_no_memory(serve):
    """A length within the limit, then a hang-up: the buffer of that length is allocated untouched, so the
    bytes never sent cost no memory (a zero-filled ``bytearray`` of the length would have)."""
    server = serve(lambda _: http(200, b"0123456789", {"Content-Length": str(1 << 30)}))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with _sync(server.url) as client, pytest.raises(lu_client.APIConnectionError):
        client.factorization_metadata("sys1")  # a call whose answer may be up to DEFAULT_MAX_ANSWER_BYTES
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 256 << 10


def test_a_gzip_bomb_stops_at_the_calls_limit(serve):
    bomb = gzip.compress(b"\0" * (64 << 20), compresslevel=9)  # 64 KiB that inflate to 64 MiB
    server = serve(lambda _: http(200, bomb, {"Content-Type": "application/json", "Content-Encoding": "gzip"}))
    for result in _run_both(server.url, lambda c: c.det(TWO)):
        assert isinstance(result, APIResponseValidationError)


def test_max_answer_bytes_caps_every_answer(serve):
    good = binary([det_output()], F64)
    server = serve(lambda _: good)
    with _sync(server.url) as client:
        np.testing.assert_array_equal(client.det(TWO), [1.0, 4.0])
    for result in _run_both(server.url, lambda c: c.det(TWO), max_answer_bytes=len(F64)):
        assert isinstance(result, APIResponseValidationError)
    for bad in (0, -1, 1.5, "1"):
        with pytest.raises(ValueError, match="max_answer_bytes"):
            LUClient("http://x", max_answer_bytes=bad)


def test_chunked_and_compressed_answers_are_writable(serve):
    body = json.dumps({"det": {"dtype": "float64", "shape": [2], "data": [1.0, 4.0]}}).encode()
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    answers = [
        http(200, chunked, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}, length=False),
        http(200, gzip.compress(body), {"Content-Type": "application/json", "Content-Encoding": "gzip"}),
    ]
    server = serve(lambda i: answers[i % 2])
    with _sync(server.url) as client:
        for _ in answers:
            out = client.det(TWO)
            np.testing.assert_array_equal(out, [1.0, 4.0])
            assert out.flags.writeable


@pytest.mark.parametrize("value", ["soon", "Mon, 99 Foo 2020", "nan", ""])
def test_an_unreadable_retry_after_falls_back_to_the_backoff(serve, value):
    server = serve(lambda _: http(503, b'{"error":"busy","code":"overloaded"}', {"Retry-After": value}))
    slept: list[float] = []
    with LUClient(server.url, max_retries=2) as client:
        client._sleep = slept.append
        with pytest.raises(lu_client.ServiceUnavailableError):
            client.det(TWO)
    assert server.count == 3 and len(slept) == 2 and all(0 <= s <= 8 for s in slept)


@pytest.mark.parametrize("fields", [{"indices": [0, 1], "info": [1]}, {"indices": None, "info": 5}, {"indices": "x"}])
def test_a_malformed_singular_matrix_error_is_still_that_error(serve, fields):
    body = json.dumps({"code": "singular_matrix", "error": "singular", **fields}).encode()
    server = serve(lambda _: http(422, body, {"Content-Type": "application/json"}))
    for result in _run_both(server.url, lambda c: c.det(TWO)):
        assert isinstance(result, lu_client.SingularMatrixError)
        assert result.indices == [] or all(isinstance(i, tuple) for i in result.indices)


def test_stored_factorization_answers_are_checked(serve):
    answers = {
        "factorize": [json_answer({"shape": [2, 2]}), json_answer({"name": "../x"}), json_answer([1])],
        "list": [json_answer({"factorizations": {"a": 1}}), json_answer({})],
    }
    for what, bodies in answers.items():
        for body in bodies:
            server = serve(lambda _, body=body: body)
            call = (lambda c: c.factorize(np.eye(2))) if what == "factorize" else (lambda c: c.list_factorizations())
            for result in _run_both(server.url, call):
                assert isinstance(result, APIResponseValidationError), (what, body, result)


@pytest.mark.parametrize(
    "limits",
    [
        {"max_request_bytes": 0, "max_elements": 0},
        {"max_request_bytes": [1], "max_elements": 5},
        {"max_request_bytes": 1, "max_elements": 1},
        [1, 2],
    ],
)
def test_unbelievable_server_limits_are_ignored(limits):
    sent: list[httpx.Request] = []
    answer = {"det": {"dtype": "float64", "shape": [300_000], "data": [1.0] * 300_000}}

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if request.url.path == "/v2":
            return httpx.Response(200, json={"limits": limits} if isinstance(limits, dict) else limits)
        return httpx.Response(200, json=answer)

    client = LUClient("http://mock", binary=False, http_client=httpx.Client(transport=httpx.MockTransport(handler)))
    out = client.det(np.ones((300_000, 2, 2)))  # 9.6 MB: the limits are looked up first
    assert out.shape == (300_000,)
    assert [r.url.path for r in sent] == ["/v2", "/det"]


def test_async_max_concurrency_must_be_positive():
    for bad in (0, -1, 1.5, None):
        with pytest.raises(ValueError, match="max_concurrency"):
            AsyncLUClient("http://x", max_concurrency=bad)


@pytest.mark.parametrize("failing", [0, 1])  # 1: a piece before it in order is the one cancelled
def test_async_split_call_cancels_the_other_pieces_when_one_fails(failing):
    started: list[int] = []
    cancelled: list[int] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        index = len(started)
        started.append(index)
        if index == failing:
            await asyncio.sleep(0.05)  # the other piece is under way
            return httpx.Response(500, json={"error": "piece failed", "code": "internal_error"})
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(index)
            raise
        return httpx.Response(500)

    async def go() -> None:
        transport = httpx.MockTransport(handler)
        client = AsyncLUClient(
            "http://mock",
            max_retries=0,
            max_elements=40,
            max_concurrency=2,
            http_client=httpx.AsyncClient(transport=transport),
        )
        with pytest.raises(lu_client.InternalServerError):
            await asyncio.wait_for(client.det(np.ones((20, 2, 2))), 10)
        await asyncio.sleep(0.1)
        assert cancelled and len(started) < 20 // 2  # the rest never went out

    asyncio.run(go())


def test_a_broadcast_batch_is_split_along_its_longest_axis():
    A = np.ones((2, 1, 4, 4))
    B = np.ones((1, 500, 4, 2))
    pieces, _stitch = split("solve", {"A": A, "B": B}, Limits(1 << 30, 2000))
    assert len(pieces) > 1
    for piece in pieces:
        assert piece.tensors["A"].shape == (2, 1, 4, 4)  # whole: it broadcasts along the split axis
        assert piece.tensors["B"].shape[1] < 500
    assert sum(p.tensors["B"].shape[1] for p in pieces) == 500


def test_a_refusal_of_a_one_dimensional_b_is_the_servers_422(serve):
    """Shapes the server refuses reach it (their answer's bound is a small one), not a client IndexError."""
    body = json.dumps({"error": "B must be a matrix", "code": "invalid_shape"}).encode()
    server = serve(lambda _: http(422, body, {"Content-Type": "application/json"}))
    for call in (
        lambda c: c.lu_solve(np.eye(3), np.array([1, 2, 3], np.int32), np.ones(3)),
        lambda c: c.det(np.ones(3)),
    ):
        for result in _run_both(server.url, call):
            assert isinstance(result, lu_client.UnprocessableEntityError), result


def test_metadata_is_a_plain_dict():
    meta = {"name": "sys1", "shape": [2, 2], "dtype": "float64", "info": None}
    client = LUClient(
        "http://mock", http_client=httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200, json=meta)))
    )
    got = client.factorization_metadata("sys1")
    assert type(got) is dict and got == meta
    with pytest.raises(KeyError):
        got["missing"]


def test_an_oversized_metadata_answer_leaves_the_limits_unknown():
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        if request.url.path == "/v2":
            return httpx.Response(
                200, json={"limits": {"max_request_bytes": 1 << 20, "max_elements": 1 << 16}, "pad": "x" * (2 << 20)}
            )
        return httpx.Response(200, json={"det": {"dtype": "float64", "shape": [300_000], "data": [1.0] * 300_000}})

    client = LUClient("http://mock", binary=False, http_client=httpx.Client(transport=httpx.MockTransport(handler)))
    assert client.det(np.ones((300_000, 2, 2))).shape == (300_000,)
    assert sent == ["/v2", "/det"]  # the 2 MiB metadata was not believed: no split
