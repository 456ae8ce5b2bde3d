from __future__ import annotations

import socket
import threading
import time
import types
from collections.abc import Iterator

import anyio.from_thread
import httpx
import pytest
import uvicorn

from lu_client import AsyncLUClient, LUClient
from service.app import create_app
from tests.service.conftest import make_settings


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class PortalTransport(httpx.BaseTransport):
    """Synchronous httpx transport into an ASGI app running on an anyio portal's event loop."""

    def __init__(self, app, portal) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.portal = portal
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        self.requests.append(request)

        async def go():
            req = httpx.Request(request.method, request.url, headers=request.headers, content=body)
            resp = await self.inner.handle_async_request(req)
            return resp.status_code, resp.headers, await resp.aread()

        status, headers, content = self.portal.call(go)
        return httpx.Response(status, headers=headers, content=content)


@pytest.fixture
def make_sync_client() -> Iterator:
    """LUClient over an in-process app (lifespan run on a portal) with the given settings."""
    cleanups = []

    def build(client_kwargs: dict | None = None, **settings) -> LUClient:
        app = create_app(make_settings(**settings))
        portal_cm = anyio.from_thread.start_blocking_portal()
        portal = portal_cm.__enter__()
        lifespan = portal.wrap_async_context_manager(app.router.lifespan_context(app))
        lifespan.__enter__()
        transport = PortalTransport(app, portal)
        client = LUClient("http://lu.test", http_client=httpx.Client(transport=transport), **(client_kwargs or {}))
        client.transport = transport  # type: ignore[attr-defined]
        cleanups.append((client, lifespan, portal_cm))
        return client

    yield build
    for client, lifespan, portal_cm in reversed(cleanups):
        client.close()
        lifespan.__exit__(None, None, None)
        portal_cm.__exit__(None, None, None)


@pytest.fixture
async def make_async_client():
    stack = []

    async def build(client_kwargs: dict | None = None, **settings) -> AsyncLUClient:
        app = create_app(make_settings(**settings))
        ctx = app.router.lifespan_context(app)
        await ctx.__aenter__()
        sent: list[httpx.Request] = []

        async def record(request: httpx.Request) -> None:
            sent.append(request)

        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), event_hooks={"request": [record]})
        client = AsyncLUClient("http://lu.test", http_client=http, **(client_kwargs or {}))
        client.transport = types.SimpleNamespace(requests=sent)  # type: ignore[attr-defined]  # as the sync one's
        stack.append((ctx, client))
        return client

    yield build
    for ctx, client in reversed(stack):
        await client.aclose()
        await ctx.__aexit__(None, None, None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def live_server() -> Iterator[str]:
    """A real uvicorn server on loopback (in a thread), with an API key."""
    port = _free_port()
    app = create_app(make_settings(api_key="live-key", max_request_bytes=1 << 20, max_elements=1 << 17))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz").status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)
    yield url
    server.should_exit = True
    thread.join(30)
