from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from service.app import create_app
from service.config import Settings


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make_settings(**overrides) -> Settings:
    base = {"device": "cpu", "warmup": False, "log_json": True, "grpc_port": 0}  # gRPC tests ask for a port
    return Settings(**{**base, **overrides})


@pytest.fixture
def settings_factory() -> Callable[..., Settings]:
    return make_settings


@pytest.fixture
async def make_client() -> AsyncIterator[Callable[..., httpx.AsyncClient]]:
    """Builds apps with given settings, runs their lifespan, returns in-process clients."""
    stack = []

    async def build(raise_app_exceptions: bool = True, **overrides) -> httpx.AsyncClient:
        app = create_app(make_settings(**overrides))
        ctx = app.router.lifespan_context(app)
        await ctx.__aenter__()
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions),
            base_url="http://lu.test",
            timeout=60,
        )
        client.app = app  # type: ignore[attr-defined]
        stack.append((ctx, client))
        return client

    yield build
    for ctx, client in reversed(stack):
        await client.aclose()
        await ctx.__aexit__(None, None, None)


@pytest.fixture
async def client(make_client) -> httpx.AsyncClient:
    return await make_client()
