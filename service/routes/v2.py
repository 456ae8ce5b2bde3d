"""The Open Inference Protocol (KServe v2) surface: one model per operation."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from service.auth import require_api_key
from service.errors import ServiceError
from service.operations import OPERATIONS, Operation, Option
from service.pipeline import serve_v2
from service.schemas import v2_openapi

__all__ = ["health_router", "router"]

router = APIRouter(prefix="/v2", dependencies=[Depends(require_api_key)], tags=["open inference protocol"])
health_router = APIRouter(prefix="/v2", tags=["health"])

VERSION = "1"
_TENSOR_TYPES = {"pivots": "INT32", "info": "INT32", "iterations": "INT32"}
# Matrix dimensions after the batch ones, for the metadata's shapes.
_TRAILING = {"pivots": 1, "info": 0, "iterations": 0, "backward_error": 0, "anorm": 0, "rcond": 0}
_TRAILING.update({"sign": 0, "logabsdet": 0, "det": 0})


def _model(name: str, version: str | None = None) -> Operation:
    op = OPERATIONS.get(name)
    if op is None:
        raise ServiceError(404, "unknown_model", f"no model {name!r}; the models are {sorted(OPERATIONS)}")
    if version not in (None, "", VERSION):
        raise ServiceError(404, "unknown_model", f"model {name!r} has only version {VERSION!r}")
    return op


def _tensor_meta(name: str, op_batch_rank: int) -> dict[str, Any]:
    datatype = _TENSOR_TYPES.get(name, "FP64")
    return {"name": name, "datatype": datatype, "shape": [-1] * op_batch_rank}


def _metadata(op: Operation) -> dict[str, Any]:
    def rank(name: str) -> int:
        return _TRAILING.get(name, 2)

    def parameter(spec: bool | Option) -> dict[str, Any]:
        if isinstance(spec, Option):
            return {"datatype": spec.datatype, "default": spec.default}
        return {"datatype": "BOOL", "default": spec}

    return {
        "name": op.name,
        "versions": [VERSION],
        "platform": "lu_core",
        "inputs": [_tensor_meta(n, rank(n)) for n in op.inputs],
        "outputs": [_tensor_meta(n, rank(n)) for n in op.outputs],
        "parameters": {k: parameter(v) for k, v in op.options.items()},
        "description": op.summary
        + " Any number of leading batch dimensions; FP32, FP64, COMPLEX64 and COMPLEX128 are accepted.",
    }


@router.get("", summary="Server metadata")
async def server_metadata(request: Request) -> dict[str, Any]:
    settings = request.app.state.settings
    return {
        "name": "lu-service",
        "version": request.app.version,
        "extensions": ["binary_tensor_data", "parameters"],
        # Not part of OIP: lets lu_client split batches that would exceed them.
        "limits": {"max_request_bytes": settings.max_request_bytes, "max_elements": settings.max_elements},
    }


@health_router.get("/health/live", summary="Liveness (OIP)")
async def live() -> Response:
    return Response(status_code=200)


@health_router.get("/health/ready", summary="Readiness (OIP)")
async def ready(request: Request) -> Response:
    return Response(status_code=200 if request.app.state.ready.is_set() else 503)


@router.get("/models/{model}", summary="Model metadata")
async def model_metadata(model: str) -> dict[str, Any]:
    return _metadata(_model(model))


@router.get("/models/{model}/versions/{version}", summary="Model metadata (versioned)")
async def model_metadata_versioned(model: str, version: str) -> dict[str, Any]:
    return _metadata(_model(model, version))


@router.get("/models/{model}/ready", summary="Model readiness")
async def model_ready(request: Request, model: str) -> Response:
    _model(model)
    return Response(status_code=200 if request.app.state.ready.is_set() else 503)


@router.get("/models/{model}/versions/{version}/ready", summary="Model readiness (versioned)")
async def model_ready_versioned(request: Request, model: str, version: str) -> Response:
    _model(model, version)
    return Response(status_code=200 if request.app.state.ready.is_set() else 503)


def _infer_extra() -> dict[str, Any]:
    # Every model takes the same request form; lu_solve's (the richest) documents it.
    return v2_openapi(OPERATIONS["lu_solve"])


@router.post("/models/{model}/infer", summary="Inference", response_class=Response, openapi_extra=_infer_extra())
async def infer(request: Request, model: str) -> Response:
    return await serve_v2(request, _model(model), VERSION)


@router.post(
    "/models/{model}/versions/{version}/infer",
    summary="Inference (versioned)",
    response_class=Response,
    openapi_extra=_infer_extra(),
)
async def infer_versioned(request: Request, model: str, version: str) -> Response:
    return await serve_v2(request, _model(model, version), VERSION)
