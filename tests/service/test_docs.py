"""/docs, /redoc and /openapi.json work offline: every asset is served by the app itself."""

from __future__ import annotations

import re
from importlib.resources import files

import pytest

from service.routes.docs import ASSETS

_URL_ATTR = re.compile(r"""(?:src|href|spec-url)\s*=\s*["']([^"']+)["']|url:\s*["']([^"']+)["']""")


def _referenced_urls(html: str) -> list[str]:
    return [a or b for a, b in _URL_ATTR.findall(html)]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("page", "needs"), [("/docs", {"swagger-ui-bundle.js", "swagger-ui.css"}), ("/redoc", {"redoc.standalone.js"})]
)
async def test_pages_reference_only_local_urls_and_each_one_is_served(client, page, needs):
    r = await client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert "http://" not in html and "https://" not in html and "//cdn" not in html, "a remote URL would need internet"
    urls = _referenced_urls(html)
    assert urls and all(u.startswith("/") and not u.startswith("//") for u in urls), urls
    assert {u.rsplit("/", 1)[1] for u in urls if u.startswith("/docs/assets/")} >= needs
    assert "/openapi.json" in urls
    for url in urls:
        got = await client.get(url)
        assert got.status_code == 200, url
        assert len(got.content) > 0


@pytest.mark.anyio
@pytest.mark.parametrize("name", sorted(ASSETS))
async def test_assets_are_the_package_files_with_their_media_type(client, name):
    r = await client.get(f"/docs/assets/{name}")
    assert r.status_code == 200
    assert r.headers["content-type"].split(";")[0] == ASSETS[name]
    assert r.content == (files("fastapi_offline") / "static" / name).read_bytes()


@pytest.mark.anyio
@pytest.mark.parametrize(
    "name",
    [
        "nope.js",
        "...",  # (a bare ".." is resolved by the client before it is sent)
        "..%2F..%2Fpyproject.toml",
        "%2e%2e",
        "swagger-ui.css.map",
        "SWAGGER-UI.CSS",
        "é.js",
        "a" * 5000,
        "__init__.py",
    ],
)
async def test_anything_else_under_assets_is_a_404_in_the_error_model(client, name):
    r = await client.get(f"/docs/assets/{name}")
    assert r.status_code == 404
    body = r.json()
    assert body["code"] == "not_found" and body["request_id"] == r.headers["x-request-id"]


@pytest.mark.anyio
async def test_the_openapi_document_and_the_oauth_redirect_page(client):
    doc = (await client.get("/openapi.json")).json()
    assert doc["info"]["title"] == "lu-service" and "/solve" in doc["paths"]
    assert not any(p.startswith("/docs") or p in ("/redoc", "/openapi.json") for p in doc["paths"])
    redirect = await client.get("/docs/oauth2-redirect")
    assert redirect.status_code == 200 and "http://" not in redirect.text and "https://" not in redirect.text


@pytest.mark.anyio
async def test_metrics_label_the_documentation_by_path(client):
    for path in ("/docs", "/redoc", "/openapi.json", "/docs/assets/swagger-ui.css", "/no/such/page"):
        await client.get(path)
    text = (await client.get("/metrics")).text
    for label in ("/docs", "/redoc", "/openapi.json", "/docs/assets/{name}"):
        assert f'endpoint="{label}",method="GET",status="200"' in text, label
    unmatched = [line for line in text.splitlines() if line.startswith("lu_requests_total") and "unmatched" in line]
    assert len(unmatched) == 1 and 'status="404"' in unmatched[0], unmatched
