"""The Open Inference Protocol (KServe v2) REST surface: one model per operation."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Path, Request
from starlette.responses import Response

from service.auth import require_api_key
from service.metadata import VERSION, find_model, model_metadata, server_metadata
from service.operations import OPERATIONS
from service.pipeline import serve_v2
from service.schemas import v2_health_openapi, v2_infer_openapi, v2_openapi

__all__ = ["health_router", "router"]

router = APIRouter(prefix="/v2", dependencies=[Depends(require_api_key)], tags=["open inference protocol"])
health_router = APIRouter(prefix="/v2", tags=["health"])

# The path parameters' schemas name the models, so that a fuzzer reaches them; any other
# name is still a 404 unknown_model (the schema is documentation, not validation).
Model = Annotated[str, Path(json_schema_extra={"enum": sorted(OPERATIONS)})]
Version = Annotated[str, Path(json_schema_extra={"enum": [VERSION]})]


def _json(body: dict[str, Any], ready: bool = True) -> Response:
    return Response(orjson.dumps(body), status_code=200 if ready else 503, media_type="application/json")


@router.get("", summary="Server metadata", include_in_schema=False)
@router.get("/", summary="Server metadata", response_class=Response, openapi_extra=v2_openapi("metadata_server"))
async def metadata(request: Request) -> Response:
    settings = request.app.state.settings
    return _json(server_metadata(request.app.version, settings.max_request_bytes, settings.max_elements))


@health_router.head("/health/live", include_in_schema=False)  # HEAD: a probe's status and headers, no body
@health_router.get(
    "/health/live", summary="Liveness (OIP)", response_class=Response, openapi_extra=v2_health_openapi("live")
)
async def live() -> Response:
    return _json({"live": True})


@health_router.head("/health/ready", include_in_schema=False)
@health_router.get(
    "/health/ready", summary="Readiness (OIP)", response_class=Response, openapi_extra=v2_health_openapi("ready")
)
async def ready(request: Request) -> Response:
    is_ready = request.app.state.ready.is_set()
    return _json({"ready": is_ready}, is_ready)


@router.get(
    "/models/{model}", summary="Model metadata", response_class=Response, openapi_extra=v2_openapi("metadata_model")
)
async def model_metadata_latest(model: Model) -> Response:
    return _json(model_metadata(find_model(model)))


@router.get(
    "/models/{model}/versions/{version}",
    summary="Model metadata (versioned)",
    response_class=Response,
    openapi_extra=v2_openapi("metadata_model"),
)
async def model_metadata_versioned(model: Model, version: Version) -> Response:
    return _json(model_metadata(find_model(model, version)))


def _model_ready(request: Request, model: str, version: str | None) -> Response:
    op = find_model(model, version)
    is_ready = request.app.state.ready.is_set()
    return _json({"name": op.name, "ready": is_ready}, is_ready)


@router.get(
    "/models/{model}/ready",
    summary="Model readiness",
    response_class=Response,
    openapi_extra=v2_health_openapi("model_ready"),
)
async def model_ready(request: Request, model: Model) -> Response:
    return _model_ready(request, model, None)


@router.get(
    "/models/{model}/versions/{version}/ready",
    summary="Model readiness (versioned)",
    response_class=Response,
    openapi_extra=v2_health_openapi("model_ready"),
)
async def model_ready_versioned(request: Request, model: Model, version: Version) -> Response:
    return _model_ready(request, model, version)


@router.post("/models/{model}/infer", summary="Inference", response_class=Response, openapi_extra=v2_infer_openapi())
async def infer(request: Request, model: Model) -> Response:
    return await serve_v2(request, find_model(model), VERSION)


@router.post(
    "/models/{model}/versions/{version}/infer",
    summary="Inference (versioned)",
    response_class=Response,
    openapi_extra=v2_infer_openapi(),
)
async def infer_versioned(request: Request, model: Model, version: Version) -> Response:
    return await serve_v2(request, find_model(model, version), VERSION)
