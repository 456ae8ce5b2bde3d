"""POST /lu_factor, /lu_unpack, /lu_solve, /lu, /solve: JSON or binary in, the same out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from service.auth import require_api_key
from service.operations import OPERATIONS, Operation
from service.pipeline import serve_native
from service.schemas import native_openapi

__all__ = ["router"]

router = APIRouter(dependencies=[Depends(require_api_key)], tags=["operations"])


def _route(op: Operation) -> Callable[[Request], Awaitable[Response]]:
    async def handler(request: Request) -> Response:
        return await serve_native(request, op)

    handler.__name__ = op.name
    return handler


for _op in OPERATIONS.values():
    router.add_api_route(
        f"/{_op.name}",
        _route(_op),
        methods=["POST"],
        summary=_op.summary,
        description=f"Inputs {', '.join(_op.inputs)}; options {', '.join(_op.options)}; "
        f"outputs {', '.join(_op.outputs)}.",
        openapi_extra=native_openapi(_op),
        response_class=Response,
    )
