"""decode → check → compute on the worker → encode: the path every POST takes.

The native and ``/v2`` routes differ only in how the body is decoded and the
answer encoded; both come from :mod:`service.codec`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request

from service.codec import (
    Decoded,
    EncodedBody,
    check_outputs_known,
    decode_binary,
    decode_native_json,
    decode_v2_json,
    encode_binary,
    encode_native_json,
    encode_v2,
)
from service.footprint import answer_bytes
from service.middleware import reservation_of
from service.operations import Operation
from service.transport import BodyResponse, offload, read_body, request_format

__all__ = ["serve_native", "serve_v2"]


def _itemsize(decoded: Decoded) -> int:
    """Bytes per element of the answer: the widest floating input (integers compute as float64)."""
    return max((t.dtype.itemsize for t in decoded.tensors.values() if t.dtype.kind in "fc"), default=8)


async def _compute(request: Request, op: Operation, decoded: Decoded) -> dict[str, Any]:
    state = request.app.state
    options = op.prepare(decoded.tensors, decoded.options, state.settings.max_elements)
    # Refused here, before the job is queued and anything reaches the device.
    state.worker.device.check_fits(op.device_bytes(decoded.tensors, options), op.name)
    reservation = reservation_of(request.scope)
    if reservation is not None:  # the answer's memory, known from the shapes, before the job is queued
        fmt = "binary" if decoded.binary and all(decoded.binary_outputs.values()) else "json"
        elements = op.output_elements(decoded.tensors, options)
        reservation.grow(answer_bytes(fmt, elements, _itemsize(decoded)), f"the answer of {op.name}")
    return await state.worker.submit(op.name, op.compute, decoded.tensors, options, reservation=reservation)


def _out_bytes(outputs: dict[str, Any]) -> int:
    return sum(v.nbytes for v in outputs.values() if v is not None)


async def _encode(outputs: dict[str, Any], fn: Callable[..., EncodedBody], *args: Any) -> BodyResponse:
    return BodyResponse(await offload(_out_bytes(outputs), fn, *args))


async def _decode(request: Request, decode_json: Callable[[memoryview | bytes, int], Decoded]) -> Decoded:
    """The body in whichever format it came, as tensors and options."""
    fmt, header_length = request_format(request)
    body = await read_body(request)
    limit = request.app.state.settings.max_elements
    if fmt == "binary":
        return await offload(len(body), decode_binary, body, header_length, limit)
    return await offload(len(body), decode_json, body, limit)


async def serve_native(request: Request, op: Operation) -> BodyResponse:
    decoded = await _decode(request, lambda body, limit: decode_native_json(body, op.inputs, limit))
    outputs = await _compute(request, op, decoded)
    if decoded.binary:
        return await _encode(outputs, encode_binary, outputs)
    return await _encode(outputs, encode_native_json, outputs)


async def serve_v2(request: Request, op: Operation, version: str) -> BodyResponse:
    decoded = await _decode(request, decode_v2_json)
    check_outputs_known(decoded, op.outputs)
    outputs = await _compute(request, op, decoded)
    return await _encode(outputs, encode_v2, op.name, decoded, outputs, version)
