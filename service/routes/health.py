"""Liveness, readiness (device and versions) and Prometheus metrics."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from service.auth import require_api_key

__all__ = ["metrics_router", "router"]

router = APIRouter(tags=["health"])
metrics_router = APIRouter(tags=["health"], dependencies=[Depends(require_api_key)])


# HEAD too (a load balancer's probe, ``curl -I``): the GET's status and headers, no body (the server drops it).
@router.head("/healthz", include_in_schema=False)
@router.get("/healthz", summary="Liveness: the process answers")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.head("/readyz", include_in_schema=False)
@router.get("/readyz", summary="Readiness: the device worker is warm; device and versions")
async def readyz(request: Request) -> Response:
    state = request.app.state
    ready = state.ready.is_set()
    body: dict[str, Any] = {
        "status": "ready" if ready else "starting",
        "device": state.device.describe(),
        "versions": state.device.versions(),
        "queue": {"depth": state.worker.depth, "max": state.settings.max_queue},
    }
    return Response(orjson.dumps(body), status_code=200 if ready else 503, media_type="application/json")


@metrics_router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
