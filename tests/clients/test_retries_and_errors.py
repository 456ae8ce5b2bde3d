"""Retries (connection errors, 429, 503, Retry-After), no retries on 4xx, the error mapping of every status."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

import lu_client
from lu_client._base import RetryPolicy

pytestmark = pytest.mark.anyio

OK_BODY = json.dumps({"X": {"dtype": "float64", "shape": [1, 1], "data": [[2.0]]}}).encode()


def error(status: int, code: str, headers: dict | None = None) -> httpx.Response:
    body = {"error": f"message for {code}", "code": code, "request_id": f"rid-{status}"}
    return httpx.Response(status, json=body, headers=headers or {})


class Script:
    """A mock server answering from a list (an exception is raised as a transport error)."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def sync_client(script: Script, **kwargs) -> tuple[lu_client.LUClient, list[float]]:
    client = lu_client.LUClient(
        "http://mock", http_client=httpx.Client(transport=httpx.MockTransport(script)), binary=False, **kwargs
    )
    delays: list[float] = []
    client._sleep = delays.append
    return client, delays


def ok() -> httpx.Response:
    return httpx.Response(200, content=OK_BODY, headers={"content-type": "application/json"})


def test_retry_after_is_honoured_for_503_and_429():
    script = Script(
        error(503, "overloaded", {"Retry-After": "3"}), error(429, "slow_down", {"Retry-After": "0.5"}), ok()
    )
    client, delays = sync_client(script)
    assert client.solve(np.ones((1, 1)), np.ones(1)).tolist() == [2.0]
    assert delays == [3.0, 0.5] and script.calls == 3


def test_retry_after_as_an_http_date_and_capped():
    script = Script(error(503, "overloaded", {"Retry-After": "Wed, 21 Oct 2099 07:28:00 GMT"}), ok())
    client, delays = sync_client(script)
    client.solve(np.ones((1, 1)), np.ones(1))
    assert delays == [RetryPolicy().max_retry_after]


def test_connection_errors_back_off_exponentially_with_jitter():
    script = Script(httpx.ConnectError("refused"), httpx.ReadError("reset"), ok())
    client, delays = sync_client(script, retry_policy=RetryPolicy(max_retries=2, initial_delay=1.0, max_delay=1.5))
    client.solve(np.ones((1, 1)), np.ones(1))
    assert 0.5 <= delays[0] <= 1.0 and 0.75 <= delays[1] <= 1.5  # 1.0 then 2.0 capped at 1.5, jittered down


def test_giving_up_raises_the_last_error():
    client, delays = sync_client(Script(*[error(503, "overloaded")] * 3))
    with pytest.raises(lu_client.ServiceUnavailableError) as excinfo:
        client.solve(np.ones((1, 1)), np.ones(1))
    assert len(delays) == 2 and excinfo.value.code == "overloaded" and excinfo.value.request_id == "rid-503"
    client, _ = sync_client(Script(*[httpx.ConnectError("refused")] * 3))
    with pytest.raises(lu_client.APIConnectionError, match="refused"):
        client.solve(np.ones((1, 1)), np.ones(1))
    client, _ = sync_client(Script(httpx.ReadTimeout("slow")), max_retries=0)
    with pytest.raises(lu_client.APITimeoutError):
        client.solve(np.ones((1, 1)), np.ones(1))


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (400, "malformed_json", lu_client.BadRequestError),
        (401, "unauthorized", lu_client.AuthenticationError),
        (404, "unknown_model", lu_client.NotFoundError),
        (413, "request_too_large", lu_client.PayloadTooLargeError),
        (415, "unsupported_media_type", lu_client.UnsupportedMediaTypeError),
        (422, "invalid_shape", lu_client.UnprocessableEntityError),
        (422, "singular_matrix", lu_client.SingularMatrixError),
        (500, "internal_error", lu_client.InternalServerError),
        (418, "teapot", lu_client.APIStatusError),
    ],
)
def test_status_errors_are_typed_and_not_retried(status, code, cls):
    script = Script(error(status, code), ok())
    client, delays = sync_client(script, max_request_bytes=1 << 30)  # limits known: a 413 is final
    with pytest.raises(cls) as excinfo:
        client.solve(np.ones((1, 1)), np.ones(1))
    assert type(excinfo.value) is cls
    assert excinfo.value.status_code == status and excinfo.value.code == code
    assert excinfo.value.request_id == f"rid-{status}" and code in str(excinfo.value)
    assert script.calls == 1 and delays == []


def test_non_json_error_bodies_still_raise_typed_errors():
    script = Script(httpx.Response(502, text="<html>bad gateway</html>", headers={"x-request-id": "gw"}), ok())
    client, _ = sync_client(script)
    assert client.solve(np.ones((1, 1)), np.ones(1)).tolist() == [2.0]  # 502 from a proxy is retried
    client, _ = sync_client(Script(httpx.Response(500, text="oops")))
    with pytest.raises(lu_client.InternalServerError, match="oops"):
        client.solve(np.ones((1, 1)), np.ones(1))


async def test_async_twin_retries_the_same_way():
    script = Script(error(503, "overloaded", {"Retry-After": "2"}), httpx.ConnectError("refused"), ok())
    client = lu_client.AsyncLUClient(
        "http://mock", http_client=httpx.AsyncClient(transport=httpx.MockTransport(script)), binary=False
    )
    delays: list[float] = []

    async def record(seconds: float) -> None:
        delays.append(seconds)

    client._sleep = record
    assert (await client.solve(np.ones((1, 1)), np.ones(1))).tolist() == [2.0]
    assert delays[0] == 2.0 and len(delays) == 2
    await client.aclose()
