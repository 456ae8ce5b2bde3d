"""The API documentation (/openapi.json, /docs, /redoc), behind the API key unless LU_DOCS_PUBLIC."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.responses import HTMLResponse, JSONResponse

from service.auth import require_api_key

__all__ = ["router"]


async def _docs_key(request: Request) -> None:
    if not request.app.state.settings.docs_public:
        await require_api_key(request)


router = APIRouter(dependencies=[Depends(_docs_key)], include_in_schema=False)


@router.get("/openapi.json")
async def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{request.app.title} - Swagger UI")


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url="/openapi.json", title=f"{request.app.title} - ReDoc")
