"""The API documentation: ``/openapi.json``, Swagger UI at ``/docs``, ReDoc at ``/redoc``.

Behind the API key unless ``LU_DOCS_PUBLIC``. Every asset the pages load (scripts,
styles, favicon) comes from the ``fastapi-offline`` package and is served here under
``/docs/assets/``, so the pages work on a machine without internet access (FastAPI's
defaults load them from a CDN). All documentation routes live in this one router, so
the access rule above covers the assets too.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from starlette.responses import HTMLResponse, JSONResponse, Response

from service.auth import require_api_key
from service.errors import ServiceError

__all__ = ["ASSETS", "router"]


async def _docs_key(request: Request) -> None:
    if not request.app.state.settings.docs_public:
        await require_api_key(request)


router = APIRouter(dependencies=[Depends(_docs_key)], include_in_schema=False, tags=["documentation"])

# name -> media type; the allow-list is also what keeps a path out of the package directory.
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}
_PACKAGE = "fastapi_offline"


@cache
def _asset(name: str) -> bytes:
    return (files(_PACKAGE) / "static" / name).read_bytes()


def _base(request: Request) -> str:
    return request.scope.get("root_path", "").rstrip("/")


@router.get("/openapi.json")
async def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    base = _base(request)
    return get_swagger_ui_html(
        openapi_url=f"{base}/openapi.json",
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=f"{base}/docs/assets/swagger-ui-bundle.js",
        swagger_css_url=f"{base}/docs/assets/swagger-ui.css",
        swagger_favicon_url=f"{base}/docs/assets/favicon.png",
        oauth2_redirect_url=f"{base}/docs/oauth2-redirect",
        # validatorUrl None: Swagger UI would otherwise send the document to validator.swagger.io.
        swagger_ui_parameters={"validatorUrl": None},
    )


@router.get("/docs/oauth2-redirect")
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    base = _base(request)
    return get_redoc_html(
        openapi_url=f"{base}/openapi.json",
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{base}/docs/assets/redoc.standalone.js",
        redoc_favicon_url=f"{base}/docs/assets/favicon.png",
        with_google_fonts=False,
    )


@router.get("/docs/assets/{name}")
async def asset(name: str) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise ServiceError(404, "not_found", f"no documentation asset {name!r}")
    return Response(_asset(name), media_type=media_type, headers={"cache-control": "public, max-age=86400"})
