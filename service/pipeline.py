"""decode → check → compute on the worker → encode: the path every POST takes.

The native and ``/v2`` routes differ only in how the body is decoded and the
answer encoded; both come from :mod:`service.codec`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from starlette.datastructures import State
from starlette.requests import Request

from service.budget import Reservation
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
from service.device import Compute
from service.errors import too_large
from service.footprint import BODY_FACTOR, JSON_SLACK, answer_bytes, json_structure_bytes
from service.middleware import reservation_of
from service.operations import Operation
from service.protocol import BODY_SINK, BodySink
from service.request_options import earliest, take_control
from service.transport import BodyResponse, offload, read_body, request_format

__all__ = ["compute", "connection_of", "decode_native", "encode_native", "serve_native", "serve_v2"]


def _itemsize(tensors: Mapping[str, Any]) -> int:
    """Bytes per element of the answer: the widest floating input (integers compute as float64)."""
    return max((t.dtype.itemsize for t in tensors.values() if t.dtype.kind in "fc"), default=8)


async def compute(
    state: State,
    op: Operation,
    decoded: Decoded,
    *,
    reservation: Reservation | None = None,
    deadline: float | None = None,
    tensors: Mapping[str, Any] | None = None,
    job: tuple[str, Compute] | None = None,
    answer: bool = True,
    connection: BodySink | None = None,
) -> dict[str, Any]:
    """Check a decoded request, reserve its answer's memory, run it on the worker (every protocol's requests
    end here).

    ``reservation`` holds the request's memory and grows by its answer's before the job is
    queued (unless ``answer=False``: the outputs are not sent back but kept, and reserved,
    elsewhere). ``deadline`` (``time.monotonic()``) comes from the transport (a gRPC
    deadline); Triton's ``timeout`` option may set an earlier one. ``tensors`` are what
    ``op`` sees when they are more than the body's (a stored factorization's LU and
    pivots); ``job`` replaces ``op``'s name and compute function. ``connection``: the HTTP request's
    (:func:`connection_of`): a client that leaves fails its job at once (:meth:`DeviceWorker.submit`).
    """
    control = take_control(decoded.options)
    seen = decoded.tensors if tensors is None else tensors
    options, elements = op.prepare_counted(seen, decoded.options, state.settings.max_elements)
    # Refused here, before the job is queued and anything reaches the device. Tensors that are not the
    # body's (a stored factorization's LU and pivots) are on the device already.
    resident = 0 if tensors is None else sum(t.nbytes for k, t in tensors.items() if k not in decoded.tensors)
    state.worker.device.check_fits(op.device_bytes(seen, options, elements), op.name, resident=resident)
    if reservation is not None and answer:  # the answer's memory, known from the shapes, before the job is queued
        fmt = "binary" if decoded.binary and all(decoded.binary_outputs.values()) else "json"
        reservation.grow(answer_bytes(fmt, elements, _itemsize(seen)), f"the answer of {op.name}")
    name, fn = job if job is not None else (op.name, op.compute)
    return await state.worker.submit(
        name,
        fn,
        decoded.tensors,
        options,
        reservation=reservation,
        deadline=earliest(control.deadline, deadline),
        connection=connection,
    )


def connection_of(request: Request) -> BodySink | None:
    """The request's connection where :mod:`service.protocol` serves it (else None: no early notice of a
    client that left)."""
    sink = request.scope.get(BODY_SINK)
    return sink if isinstance(sink, BodySink) else None


def _out_bytes(outputs: dict[str, Any]) -> int:
    return sum(v.nbytes for v in outputs.values() if v is not None)


async def _encode(outputs: dict[str, Any], fn: Callable[..., EncodedBody], *args: Any) -> BodyResponse:
    return BodyResponse(await offload(_out_bytes(outputs), fn, *args))


async def _decode(request: Request, decode_json: Callable[[memoryview | bytes, int], Decoded]) -> Decoded:
    """The body in whichever format it came, as tensors and options."""
    fmt, header_length = request_format(request)
    body = await read_body(request)
    settings = request.app.state.settings
    await _reserve_json(request, fmt, body, header_length, settings.max_json_bytes)
    limit = settings.max_elements
    if fmt == "binary":
        return await offload(len(body), decode_binary, body, header_length, limit)
    return await offload(len(body), decode_json, body, limit)


async def _reserve_json(
    request: Request, fmt: str, body: memoryview | bytes, header_length: str | None, limit: int
) -> None:
    """Before any JSON is parsed, reserve what its lists, objects and strings will take (beyond the per-byte
    factor the admission reserved): 24x its text held for flat numbers, up to 44x for nested lists. A binary
    request's JSON header is JSON too: bounded by ``LU_MAX_JSON_BYTES`` and reserved as JSON, not at the
    binary factor (a body that was all header parsed into 3.2 GiB against 192 MiB reserved)."""
    reservation = reservation_of(request.scope)
    if fmt == "binary":
        hlen = int(header_length or 0)  # digits: request_format checked them
        if not 0 < hlen <= len(body):
            return  # decode_binary answers the malformed header
        if hlen > limit:
            raise too_large(
                "request_too_large",
                f"the binary request's JSON header (Inference-Header-Content-Length = {hlen}) exceeds "
                f"LU_MAX_JSON_BYTES = {limit} bytes: send tensors as binary data",
            )
        text = memoryview(body)[:hlen]
        extra = BODY_FACTOR["json"] * hlen + await offload(hlen, json_structure_bytes, text)
    else:
        extra = await offload(len(body), json_structure_bytes, body)  # (64 MiB: ~0.1 s, off the event loop)
    if reservation is not None and extra > JSON_SLACK:
        reservation.grow(extra, "the parsed JSON")


async def decode_native(request: Request, tensor_names: tuple[str, ...]) -> Decoded:
    """A native request body (JSON keys in ``tensor_names`` are tensors, the others options)."""
    return await _decode(request, lambda body, limit: decode_native_json(body, tensor_names, limit))


async def encode_native(outputs: dict[str, Any], binary: bool) -> BodyResponse:
    """The native answer: binary framing for a binary request, else JSON."""
    if binary:
        return await _encode(outputs, encode_binary, outputs)
    return await _encode(outputs, encode_native_json, outputs)


async def serve_native(request: Request, op: Operation) -> BodyResponse:
    decoded = await decode_native(request, op.inputs)
    outputs = await compute(
        request.app.state, op, decoded, reservation=reservation_of(request.scope), connection=connection_of(request)
    )
    return await encode_native(outputs, decoded.binary)


async def serve_v2(request: Request, op: Operation, version: str) -> BodyResponse:
    decoded = await _decode(request, decode_v2_json)
    check_outputs_known(decoded, op.outputs)
    outputs = await compute(
        request.app.state, op, decoded, reservation=reservation_of(request.scope), connection=connection_of(request)
    )
    return await _encode(outputs, encode_v2, op.name, decoded, outputs, version)
