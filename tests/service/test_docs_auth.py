"""With LU_API_KEY set, the API documentation needs the key too, unless LU_DOCS_PUBLIC opens it."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.anyio

DOCS = ("/docs", "/redoc", "/openapi.json")


async def test_docs_need_the_key(make_client):
    client = await make_client(api_key="k1")
    for path in DOCS:
        r = await client.get(path)
        assert r.status_code == 401 and r.json()["code"] == "unauthorized", path
        assert (await client.get(path, headers={"authorization": "Bearer k1"})).status_code == 200, path


async def test_docs_public_opens_them(make_client):
    client = await make_client(api_key="k1", docs_public=True)
    for path in DOCS:
        assert (await client.get(path)).status_code == 200, path
    assert (await client.post("/solve", json={"A": [[1.0]], "B": [1.0]})).status_code == 401


async def test_docs_open_without_a_key(client):
    for path in DOCS:
        assert (await client.get(path)).status_code == 200, path
    assert "lu_factor" in (await client.get("/openapi.json")).text


async def test_the_assets_follow_the_pages(make_client):
    closed = await make_client(api_key="k1")
    assert (await closed.get("/docs/assets/swagger-ui.css")).status_code == 401
    assert (await closed.get("/docs/assets/swagger-ui.css", headers={"authorization": "Bearer k1"})).status_code == 200
    opened = await make_client(api_key="k1", docs_public=True)
    assert (await opened.get("/docs/assets/redoc.standalone.js")).status_code == 200
