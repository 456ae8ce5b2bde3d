"""The compute routes' shortcut past FastAPI's router (service/hot_routes.py).

Every other service test reaches the compute routes through it too; these check
that it is the path taken, that it answers as FastAPI would (authentication, errors,
metrics labels), and that everything it does not claim still reaches FastAPI.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from fastapi import APIRouter, Depends, Request
from fastapi.routing import APIRoute
from starlette.responses import Response

from service.auth import require_api_key
from service.errors import ServiceError
from service.hot_routes import HotRoutes, hot_routes
from service.metrics import Metrics
from service.routes import factorizations, native, v2
from tests.service.wire import binary_request, parse_binary

pytestmark = pytest.mark.anyio

RNG = np.random.default_rng(7)
A = RNG.standard_normal((3, 4, 4)) + 4 * np.eye(4)
B = RNG.standard_normal((3, 4, 2))
SINGULAR = np.zeros((2, 3, 3))


@pytest.fixture
def no_router(monkeypatch):
    """FastAPI's router fails every request it gets: what still answers did not go through it."""

    async def refuse(self, scope, receive, send):
        raise AssertionError(f"FastAPI's router got {scope['method']} {scope['path']}")

    monkeypatch.setattr(APIRouter, "__call__", refuse)


def _metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_every_compute_route_is_answered_without_fastapis_router(make_client, no_router):
    client = await make_client(raise_app_exceptions=False)
    body, headers = binary_request({"A": A, "B": B})
    for path in ("/solve", "/v2/models/solve/infer", "/v2/models/solve/versions/1/infer"):
        r = await client.post(path, content=body, headers=headers)
        assert r.status_code == 200, (path, r.text)
        _, out = parse_binary(r.content, int(r.headers["inference-header-content-length"]))
        np.testing.assert_allclose(out["X"], np.linalg.solve(A, B), rtol=1e-10)
    r = await client.post("/lu_factor", json={"A": A[0].tolist()})
    assert r.status_code == 200
    # The router is really out of the way: a route the shortcut does not claim now fails.
    assert (await client.get("/healthz")).status_code == 500


async def test_stored_factorization_routes_are_answered_without_fastapis_router(make_client, monkeypatch):
    client = await make_client(raise_app_exceptions=False)
    assert (await client.put("/factorizations/m", json={"A": A.tolist()})).status_code == 201

    async def refuse(self, scope, receive, send):
        raise AssertionError("router reached")

    monkeypatch.setattr(APIRouter, "__call__", refuse)
    r = await client.post("/factorizations/m/solve", json={"B": B.tolist()})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.array(r.json()["X"]["data"]), np.linalg.solve(A, B), rtol=1e-10)
    r = await client.post("/factorizations/m/unpack", content=b"", headers={"content-length": "0"})
    assert r.status_code == 200, r.text
    assert (await client.post("/factorizations/missing/solve", json={"B": B.tolist()})).status_code == 404


async def test_metrics_name_the_route_templates(client):
    body, headers = binary_request({"A": A, "B": B})
    assert (await client.post("/solve", content=body, headers=headers)).status_code == 200
    assert (await client.post("/v2/models/solve/infer", content=body, headers=headers)).status_code == 200
    text = (await client.get("/metrics")).text
    assert _metric(text, "lu_requests_total", endpoint="/solve", method="POST", status="200") == 1
    assert _metric(text, "lu_requests_total", endpoint="/v2/models/{model}/infer", status="200") == 1
    assert _metric(text, "lu_request_bytes_total", endpoint="/solve") == len(body)


async def test_errors_are_answered_and_counted_as_fastapis_handlers_do(client):
    body, headers = binary_request({"A": SINGULAR, "B": np.ones((2, 3, 1))})
    r = await client.post("/solve", content=body, headers=headers)
    assert r.status_code == 422 and r.json()["code"] == "singular_matrix"
    assert r.json()["request_id"] == r.headers["x-request-id"]
    r = await client.post("/v2/models/no_such_model/infer", content=body, headers=headers)
    assert r.status_code == 404 and r.json()["code"] == "unknown_model"
    r = await client.post("/solve", content=b"{not json")
    assert r.status_code == 400 and r.json()["code"] == "malformed_json"
    text = (await client.get("/metrics")).text
    for code in ("singular_matrix", "unknown_model", "malformed_json"):
        assert _metric(text, "lu_errors_total", code=code) == 1, code
    assert _metric(text, "lu_requests_total", endpoint="/solve", status="422") == 1


async def test_the_api_key_is_checked_before_the_body_is_read(make_client):
    client = await make_client(api_key="k1,k2")
    body, headers = binary_request({"A": A, "B": B})
    for auth in (None, "Bearer wrong", "Basic k1", "Bearer"):
        extra = {} if auth is None else {"authorization": auth}
        r = await client.post("/solve", content=body, headers={**headers, **extra})
        assert r.status_code == 401 and r.json()["code"] == "unauthorized", auth
        assert r.headers["www-authenticate"] == "Bearer"
    r = await client.post("/v2/models/solve/infer", content=body, headers={**headers, "authorization": "Bearer k2"})
    assert r.status_code == 200


async def test_what_the_shortcut_does_not_claim_reaches_fastapi(client):
    assert (await client.get("/solve")).status_code == 405
    assert (await client.put("/solve", json={})).status_code == 405
    assert (await client.post("/nope", json={})).status_code == 404
    assert (await client.post("/v2/models/solve/infer/more", json={})).status_code == 404
    assert (await client.get("/v2/models/solve")).status_code == 200  # a GET under /v2 stays FastAPI's


@pytest.fixture
def no_hot_routes(monkeypatch):
    """The shortcut fails every request it gets: what still answers went through FastAPI."""

    async def refuse(self, scope, receive, send):
        raise AssertionError(f"HotRoutes got {scope['method']} {scope['path']}")

    monkeypatch.setattr(HotRoutes, "__call__", refuse)


async def test_a_root_path_leaves_routing_to_fastapi(make_client, no_hot_routes):
    """Under a root_path FastAPI matches the path less its prefix: a path that is a compute route's
    (the shortcut's match) may be another route, or none, for the router."""
    client = await make_client()
    client._transport.root_path = "/api"  # type: ignore[attr-defined]  (what a proxy's prefix sets)
    r = await client.post("/api/lu_factor", json={"A": A[0].tolist()})
    assert r.status_code == 200, r.text
    client._transport.root_path = "/v2"  # type: ignore[attr-defined]
    body, headers = binary_request({"A": A, "B": B})
    r = await client.post("/v2/models/solve/infer", content=body, headers=headers)
    assert r.status_code == 404, r.text  # FastAPI looked for /models/solve/infer


async def test_an_apps_root_path_leaves_routing_to_fastapi(make_client, no_hot_routes, caplog):
    client = await make_client()
    client.app.root_path = "/api"  # type: ignore[attr-defined]  (FastAPI(root_path=...): set in FastAPI's __call__)
    with caplog.at_level(logging.INFO, logger="service"):
        r = await client.post("/api/lu_factor", json={"A": A[0].tolist()})
    assert r.status_code == 200, r.text
    assert any("root_path '/api'" in m for m in caplog.messages), caplog.messages


async def test_dependency_overrides_are_honoured(make_client):
    """FastAPI applies app.dependency_overrides to the compute routes' API-key dependency; so does the app."""
    client = await make_client(api_key="k1")
    body, headers = binary_request({"A": A, "B": B})
    assert (await client.post("/solve", content=body, headers=headers)).status_code == 401
    client.app.dependency_overrides[require_api_key] = lambda: None  # type: ignore[attr-defined]
    r = await client.post("/solve", content=body, headers=headers)
    assert r.status_code == 200, r.text  # (the shortcut, which checks the key itself, would say 401)
    client.app.dependency_overrides.clear()  # type: ignore[attr-defined]
    assert (await client.post("/solve", content=body, headers=headers)).status_code == 401


async def test_middleware_added_to_the_app_runs_for_the_compute_routes(make_client, no_hot_routes, caplog):
    client = await make_client()
    seen: list[str] = []

    class Tap:  # a pure ASGI middleware, added before the first request
        def __init__(self, app) -> None:
            self.app = app

        async def __call__(self, scope, receive, send) -> None:
            if scope["type"] == "http":
                seen.append(f"{scope['method']} {scope['path']}")
            await self.app(scope, receive, send)

    client.app.add_middleware(Tap)  # type: ignore[attr-defined]
    body, headers = binary_request({"A": A, "B": B})
    with caplog.at_level(logging.INFO, logger="service"):
        for _ in range(2):
            assert (await client.post("/solve", content=body, headers=headers)).status_code == 200
    assert seen == ["POST /solve"] * 2
    told = [m for m in caplog.messages if "through FastAPI's router" in m]
    assert len(told) == 1 and "Tap" in told[0], caplog.messages


def _router_with(*routes) -> list[APIRoute]:
    router = APIRouter(dependencies=[Depends(require_api_key)])
    for path, endpoint, extra in routes:
        router.add_api_route(path, endpoint, methods=["POST"], dependencies=extra)
    return hot_routes(router.routes)


async def _ok(request: Request) -> Response:
    return Response()


async def _with_int(request: Request, k: int) -> Response:
    return Response()


async def _with_query(request: Request, q: str = "") -> Response:
    return Response()


def _other_dependency() -> None:
    return None


def test_routes_it_could_not_serve_as_fastapi_does_are_refused_at_start():
    metrics = Metrics("cpu", "test")
    HotRoutes(_router_with(("/ok", _ok, [])), api_keys=(), metrics=metrics)  # fine
    with pytest.raises(TypeError, match="dependencies"):
        HotRoutes(_router_with(("/dep", _ok, [Depends(_other_dependency)])), api_keys=(), metrics=metrics)
    with pytest.raises(TypeError, match="not a string"):
        HotRoutes(_router_with(("/int/{k:int}", _with_int, [])), api_keys=(), metrics=metrics)
    with pytest.raises(TypeError, match="parameters"):
        HotRoutes(_router_with(("/query", _with_query, [])), api_keys=(), metrics=metrics)


def test_the_service_declares_only_servable_hot_routes():
    routes = hot_routes([*native.router.routes, *v2.router.routes, *factorizations.router.routes])
    paths = {r.path for r in routes}
    assert {"/solve", "/lu_factor", "/v2/models/{model}/infer", "/factorizations/{name}/solve"} <= paths
    assert not any(p.startswith("/factorizations/{name}") and p.count("/") == 2 for p in paths)  # PUT/GET/DELETE
    HotRoutes(routes, api_keys=(), metrics=Metrics("cpu", "test"))


# ---------------------------------------------------------------- the shortcut and FastAPI's router, side by side

_COMPARED_HEADERS = (
    "content-type",
    "content-length",
    "inference-header-content-length",
    "www-authenticate",
    "retry-after",
    "connection",
    "x-request-id",
)
_COMPARED_METRICS = ("lu_requests_total{", "lu_errors_total{", "lu_request_bytes_total{", "lu_response_bytes_total{")


def _differential_requests() -> list[tuple[str, str, dict]]:
    """(method, path, httpx arguments) of requests whose answers must not depend on the path taken."""
    key = {"authorization": "Bearer k1"}
    good, binary = binary_request({"A": A, "B": B})
    singular, singular_headers = binary_request({"A": SINGULAR, "B": np.ones((2, 3, 1))})
    big, big_headers = binary_request({"A": np.ones((40, 8, 8))})  # > LU_MAX_REQUEST_BYTES below
    json_ = {"content-type": "application/json"}
    return [
        ("POST", "/solve", {"content": good, "headers": {**binary, **key}}),
        ("POST", "/lu_factor", {"json": {"A": A.tolist()}, "headers": key}),
        ("POST", "/solve", {"content": singular, "headers": {**singular_headers, **key}}),
        ("POST", "/solve", {"content": b"{not json", "headers": {**json_, **key}}),
        ("POST", "/lu_solve", {"content": b'{"LU": [[1.0]], "pivots": [1]}', "headers": {**json_, **key}}),
        ("POST", "/solve", {"content": big, "headers": {**big_headers, **key}}),
        ("POST", "/solve", {"content": b"{}", "headers": {**json_, **key, "content-length": "2x"}}),
        ("POST", "/solve", {"content": good, "headers": binary}),
        ("POST", "/solve", {"content": good, "headers": {**binary, "authorization": "Bearer nope"}}),
        ("POST", "/v2/models/solve/infer", {"content": good, "headers": {**binary, **key}}),
        ("POST", "/v2/models/no_such_model/infer", {"content": good, "headers": {**binary, **key}}),
        ("POST", "/v2/models/solve/versions/1/infer", {"content": good, "headers": {**binary, **key}}),
        ("POST", "/factorizations/unknown/solve", {"json": {"B": B.tolist()}, "headers": key}),
        ("POST", "/factorizations/unknown/unpack", {"json": {}, "headers": key}),
        ("POST", "/factorizations/unknown/unpack", {"json": {}, "headers": {**key, "content-type": "text/plain"}}),
        ("POST", "/solve", {"json": {"A": A.tolist(), "B": B.tolist()}, "headers": {**key, "content-encoding": "br"}}),
    ]


async def _served_both_ways(make_client, requests, **settings) -> tuple[list, list]:
    """Each request's answer and the request metrics, from an app taking the shortcut and one that does not."""
    calls = 0
    serve = HotRoutes.__call__

    async def counted(self, scope, receive, send):
        nonlocal calls
        calls += 1
        await serve(self, scope, receive, send)

    results = []
    for hot in (True, False):
        client = await make_client(raise_app_exceptions=False, **settings)
        if not hot:
            client.app.hot = None  # type: ignore[attr-defined]  (FastAPI's router serves everything)
        HotRoutes.__call__ = counted  # type: ignore[method-assign]
        try:
            answers = []
            for i, (method, path, kwargs) in enumerate(requests):
                headers = {"x-request-id": f"req-{i}", **kwargs.get("headers", {})}
                r = await client.request(method, path, **{**kwargs, "headers": headers})
                kept = {h: r.headers.get(h) for h in _COMPARED_HEADERS}
                answers.append((method, path, r.status_code, kept, r.content))
        finally:
            HotRoutes.__call__ = serve  # type: ignore[method-assign]
        text = (await client.get("/metrics", headers={"authorization": "Bearer k1"})).text
        metrics = sorted(line for line in text.splitlines() if line.startswith(_COMPARED_METRICS))
        assert metrics
        results.append((answers, metrics, calls))
        calls = 0
    (hot_answers, hot_metrics, hot_calls), (router_answers, router_metrics, router_calls) = results
    assert hot_calls > 0 and router_calls == 0  # the two apps really took different paths
    for h, r in zip(hot_answers, router_answers, strict=True):
        assert h == r
    assert hot_metrics == router_metrics
    return hot_answers, hot_metrics


async def test_the_shortcut_answers_and_counts_exactly_as_fastapis_router(make_client):
    answers, metrics = await _served_both_ways(
        make_client, _differential_requests(), api_key="k1", max_request_bytes=8192
    )
    statuses = [status for _, _, status, _, _ in answers]
    assert statuses == [200, 200, 422, 400, 422, 413, 400, 401, 401, 200, 404, 200, 404, 404, 415, 415]
    # Refused before the route was known (413, a malformed Content-Length): unmatched on both paths.
    assert 'lu_requests_total{device="cpu",endpoint="unmatched",method="POST",status="413"} 1.0' in metrics
    assert 'lu_requests_total{device="cpu",endpoint="unmatched",method="POST",status="400"} 1.0' in metrics
    assert 'lu_requests_total{device="cpu",endpoint="/solve",method="POST",status="401"} 2.0' in metrics


async def _asgi(app, path: str, body: bytes, headers: dict[str, str]) -> list[dict]:
    """The messages ``app`` sends for one POST (an answer cut short included, which httpx refuses)."""
    raw = [(k.encode(), v.encode()) for k, v in {**headers, "content-length": str(len(body))}.items()]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": raw,
        "client": ("127.0.0.1", 1), "server": ("lu.test", 80),
    }  # fmt: skip
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


@pytest.mark.parametrize("when", ["before", "after"])
async def test_an_error_while_the_answer_is_sent_is_handled_as_by_fastapis_router(make_client, monkeypatch, when):
    """Raised before the answer started: answered by the error handler. After: not answered again (a 500
    counted, the answer cut short), as Starlette's exception wrapper does."""
    from service.transport import BodyResponse

    send_answer = BodyResponse.__call__

    async def failing(self, scope, receive, send):
        if when == "after":
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        raise ServiceError(503, "late_failure", "failed while answering")

    body, headers = binary_request({"A": A, "B": B})
    seen = []
    for hot in (True, False):
        client = await make_client()
        if not hot:
            client.app.hot = None  # type: ignore[attr-defined]
        monkeypatch.setattr(BodyResponse, "__call__", failing)
        sent = await _asgi(client.app, "/solve", body, {**headers, "x-request-id": "same"})  # type: ignore[attr-defined]
        monkeypatch.setattr(BodyResponse, "__call__", send_answer)
        text = (await client.get("/metrics")).text
        seen.append((sent, sorted(line for line in text.splitlines() if line.startswith(_COMPARED_METRICS))))
    assert seen[0] == seen[1]
    sent, metrics = seen[0]
    if when == "before":
        assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
        assert sent[0]["status"] == 503 and b"late_failure" in sent[1]["body"]
        assert 'lu_errors_total{code="late_failure"} 1.0' in metrics
    else:
        assert [m["type"] for m in sent] == ["http.response.start"] and sent[0]["status"] == 200
        assert 'lu_errors_total{code="internal_error"} 1.0' in metrics
        assert not any("late_failure" in m for m in metrics)


def test_routes_are_taken_in_the_form_the_app_serves_them():
    """After include_router a route has the include's prefix and dependencies: those are what is checked and
    matched, while scope["route"] is the route FastAPI's router puts there."""
    from fastapi import FastAPI

    app = FastAPI()
    app.include_router(native.router, prefix="/p")
    served = hot_routes(app.router.routes)
    assert {r.path for r in served} == {f"/p{r.path}" for r in native.router.routes}
    for r in served:
        assert r.route in native.router.routes and r.endpoint is r.route.endpoint
    HotRoutes(served, api_keys=(), metrics=Metrics("cpu", "test"))
    guarded = FastAPI()
    guarded.include_router(native.router, dependencies=[Depends(_other_dependency)])
    with pytest.raises(TypeError, match="dependencies"):
        HotRoutes(hot_routes(guarded.router.routes), api_keys=(), metrics=Metrics("cpu", "test"))
