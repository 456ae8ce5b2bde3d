"""The compute routes' shortcut past FastAPI's router (service/hot_routes.py).

Every other service test reaches the compute routes through it too; these check
that it is the path taken, that it answers as FastAPI would (authentication, errors,
metrics labels), and that everything it does not claim still reaches FastAPI.
"""

from __future__ import annotations

import numpy as np
import pytest
from fastapi import APIRouter, Depends, Request
from fastapi.routing import APIRoute
from starlette.responses import Response

from service.auth import require_api_key
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


async def test_a_root_path_leaves_routing_to_fastapi(make_client):
    client = await make_client()
    client._transport.root_path = "/api"  # type: ignore[attr-defined]  (what a proxy's prefix sets)
    r = await client.post("/api/lu_factor", json={"A": A[0].tolist()})
    assert r.status_code == 200, r.text


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
