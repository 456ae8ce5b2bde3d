"""Reading request bodies in the right format and sending encoded bodies without joining them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Literal, TypeVar

import anyio
import anyio.to_thread
import numpy as np
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from service.bodies import BodyPool
from service.codec import HEADER_LENGTH, EncodedBody
from service.compression import Inflater, inflater_for
from service.errors import ServiceError, bad_request, brief
from service.footprint import BODY_FACTOR
from service.middleware import reservation_of
from service.protocol import BODY_SINK, READ_STARTED, BodySink

__all__ = ["BodyResponse", "header", "offload", "read_body", "request_format"]

T = TypeVar("T")

_HEADER_LENGTH = HEADER_LENGTH.encode()
# Below this many bytes, decoding or encoding on the event loop is cheaper than a thread hop.
OFFLOAD_BYTES = 1 << 20
# Below this many bytes, an answer's chunks are joined and sent in one message (one socket write).
JOIN_BYTES = 1 << 16


def header(request: Request, name: bytes) -> str | None:
    """The first value of header ``name`` (lower case), as ``request.headers.get`` but without its
    ``KeyError`` for an absent header (which cost more than the rest of a small request's checks)."""
    for key, value in request.scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def request_format(request: Request) -> tuple[Literal["json", "binary"], str | None]:
    """``("binary", header_length)`` for the OIP binary framing, ``("json", None)`` for JSON; 415 otherwise.

    The binary framing is told by its header alone; a declared type other than JSON, octet-stream
    or none (a form, say) is still a 415, since such a body is certainly not an inference request.
    """
    content_type = (header(request, b"content-type") or "").split(";")[0].strip().lower()
    header_length = _framing_length(request)
    if content_type not in ("", "application/json", "application/octet-stream"):
        raise ServiceError(
            415,
            "unsupported_media_type",
            f"content type {brief(content_type)} is not supported: send application/json, or application/octet-stream "
            "with Inference-Header-Content-Length",
        )
    if header_length is not None:
        # Plain ASCII digits only (int() would also take "+100", "1_000" or "²"), and within 64 bits: the
        # JSON bound and reservation (pipeline._reserve_json) and the decoder read the same number.
        if not (header_length.isascii() and header_length.isdigit() and len(header_length) <= 18):
            raise bad_request(
                "malformed_header",
                f"Inference-Header-Content-Length must be a byte count (digits), not {brief(header_length)}",
            )
        return "binary", header_length
    # Triton's rule: without Inference-Header-Content-Length the body is JSON, whatever its
    # content type (tritonclient.http.aio sends JSON bodies as application/octet-stream).
    return "json", None


def _framing_length(request: Request) -> str | None:
    """Inference-Header-Content-Length, given once or repeated with one value; 400 where repeats
    disagree (which one a proxy or another server would take is anyone's guess: the header decides
    where the tensors' bytes start)."""
    found: str | None = None
    for key, value in request.scope["headers"]:
        if key == _HEADER_LENGTH:
            text = value.decode("latin-1").strip()
            if found is not None and text != found:
                raise bad_request(
                    "malformed_header",
                    f"Inference-Header-Content-Length is given more than once, with different values "
                    f"({brief(found)} and {brief(text)})",
                )
            found = text
    return found


async def read_body(request: Request) -> memoryview | bytes:
    """The whole body, copied once into a buffer of the declared length, within the read deadline.

    Joining the received chunks afterwards (what ``Request.body`` does) costs a
    second pass over fresh memory: at 128 MiB, ~2x the time of this single copy.
    The buffer comes from the app's pool of receive buffers (:mod:`service.bodies`,
    ``LU_BODY_POOL_BYTES``): a buffer used before is resident already, so a big
    body costs its copy and no page faults. It goes back to the pool only when
    the request and its job have both ended (the decoded tensors are views into
    it). A fresh buffer is allocated without being touched (``np.empty``), so its
    pages become resident only as bytes arrive: a client that declares 256 MiB
    and sends one byte costs one page, not 256 MiB (``RequestMiddleware`` has
    already bounded the length and reserved its memory against the budget).
    The view returned is exactly the declared length, and every byte of it has
    been written by this request (else 400 ``truncated_body``).

    The deadline (:class:`ReadDeadline`) starts at the request's first byte; a body
    that falls behind it is a 408, and the connection is closed. A gzip or deflate
    body (``Content-Encoding``) is inflated as it arrives, bounded in inflated bytes,
    which are reserved too.
    """
    settings = request.app.state.settings
    started = request.scope.get(READ_STARTED)
    if started is None:  # not served by service.protocol (a test client)
        started = anyio.current_time()
    deadline = ReadDeadline(started, settings.read_timeout_s, settings.min_upload_rate)
    inflater = _inflater(request)
    if inflater is not None:
        return await _inflate(_within(request, deadline), inflater)
    declared = header(request, b"content-length")
    if declared is None or not declared.isdigit():
        return b"".join([chunk async for chunk in _within(request, deadline)])  # chunked: counted as it streams
    size = int(declared)
    view, resident = _receive_buffer(request, size)
    sink = request.scope.get(BODY_SINK)
    if isinstance(sink, BodySink):
        await _sink_into(sink, view, deadline, resident)
        return view
    got = 0
    async for chunk in _within(request, deadline):
        end = got + len(chunk)
        if end > size:
            raise bad_request("malformed_body", f"the body is longer than its Content-Length {size}")
        view[got:end] = chunk
        got = end
    if got != size:
        raise bad_request("truncated_body", f"the body ended after {got} of {size} bytes")
    return view


def _receive_buffer(request: Request, size: int) -> tuple[memoryview, bool]:
    """A buffer of exactly ``size`` bytes for the body, from the app's pool when the request has a reservation,
    and whether its pages are resident (a reused buffer; a fresh one is untouched).

    The lease ends with the reservation (``Reservation.on_release``): when the request has ended
    *and* its job on the worker, the two parties that use the tensors decoded from these bytes.
    """
    pool: BodyPool | None = getattr(request.app.state, "bodies", None)
    reservation = reservation_of(request.scope)
    if pool is None or reservation is None:
        return memoryview(np.empty(size, np.uint8)), False
    lease = pool.take(size)
    reservation.on_release(lease.release)
    return lease.view, lease.reused


async def _sink_into(sink: BodySink, view: memoryview, deadline: ReadDeadline, resident: bool = False) -> None:
    """The body written into ``view`` by the protocol as it arrives (:class:`service.protocol.BodySink`).

    The same checks as the chunk-by-chunk path: the deadline by bytes received (408), a body
    longer or shorter than its Content-Length (400), a client that left (``ClientDisconnect``).
    Closing the sink in every case is what makes the buffer safe to reuse: once this returns
    or raises, the protocol writes nothing more into it. Only a ``resident`` buffer may be read
    into from the socket directly: the kernel faulting in a fresh buffer's pages one by one as it
    copies made a 128 MiB body 4.6x a plain copy, against 1.5x through the parser.
    """
    sink.open(view, direct=resident)
    try:
        while not sink.finished:
            remaining = deadline.at(sink.received) - anyio.current_time()
            if remaining <= 0:
                raise deadline.timeout_error()
            with anyio.move_on_after(remaining):
                await sink.wait()
    finally:
        sink.close()
    if sink.overflow:
        raise bad_request("malformed_body", f"the body is longer than its Content-Length {len(view)}")
    if sink.disconnected:
        raise ClientDisconnect()
    if sink.received != len(view):
        raise bad_request("truncated_body", f"the body ended after {sink.received} of {len(view)} bytes")


class ReadDeadline:
    """When a request must have arrived: ``LU_READ_TIMEOUT_S`` after its first byte, plus its bytes so far
    at ``LU_MIN_UPLOAD_RATE``, so a large body on a slow link may take longer, a trickle may not.

    The protocol layer (``service.protocol``) applies the same rule as a backstop.
    """

    def __init__(self, started: float, timeout_s: float, min_rate: int) -> None:
        self.started, self.timeout_s, self.min_rate = started, timeout_s, min_rate

    def at(self, received: int) -> float:
        allowance = received / self.min_rate if self.min_rate else 0.0
        return self.started + self.timeout_s + allowance

    def timeout_error(self) -> ServiceError:
        rate = f" plus 1 s per {self.min_rate} bytes (LU_MIN_UPLOAD_RATE)" if self.min_rate else ""
        return ServiceError(
            408,
            "request_timeout",
            f"the request body did not arrive within LU_READ_TIMEOUT_S = {self.timeout_s} s{rate}",
            headers={"Connection": "close"},
        )


async def _within(request: Request, deadline: ReadDeadline) -> AsyncIterator[bytes]:
    received = 0
    chunks = request.stream().__aiter__()
    while True:
        try:
            with anyio.fail_after(max(deadline.at(received) - anyio.current_time(), 0.0)):
                chunk = await chunks.__anext__()
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise deadline.timeout_error() from None
        received += len(chunk)
        yield chunk


def _inflater(request: Request) -> Inflater | None:
    """An inflater for a compressed body, bounded and reserved as the body's format is (415 for other codings)."""
    coding = header(request, b"content-encoding")
    if coding is None:
        return None  # the usual case, decided before any other work
    settings = request.app.state.settings
    fmt = "binary" if header(request, _HEADER_LENGTH) is not None else "json"
    if fmt == "binary":
        limit, name = settings.max_request_bytes, "LU_MAX_REQUEST_BYTES"
    else:
        limit, name = min(settings.max_json_bytes, settings.max_request_bytes), "LU_MAX_JSON_BYTES"
    reservation = reservation_of(request.scope)

    def reserve(nbytes: int) -> None:
        # The middleware reserved for the compressed bytes; the inflated ones are decoded as a body is.
        if reservation is not None:
            reservation.grow(BODY_FACTOR[fmt] * nbytes, "the inflated body")

    return inflater_for(coding, limit, reserve, name)


async def _inflate(chunks: AsyncIterator[bytes], inflater: Inflater) -> memoryview:
    async for chunk in chunks:
        # Small bodies inflate on the loop; once the output is big, each chunk goes to a thread.
        if inflater.produced < OFFLOAD_BYTES:
            inflater.feed(chunk)
        else:
            await anyio.to_thread.run_sync(inflater.feed, chunk)
    return memoryview(inflater.finish())


async def offload(nbytes: int, fn: Callable[..., T], *args: object) -> T:
    """Run CPU-heavy (de)serialisation of big bodies off the event loop."""
    if nbytes < OFFLOAD_BYTES:
        return fn(*args)
    return await anyio.to_thread.run_sync(fn, *args)


class BodyResponse(Response):
    """Sends an :class:`EncodedBody` chunk by chunk with its exact Content-Length (no join copy)."""

    def __init__(self, body: EncodedBody, status_code: int = 200) -> None:
        # Response.__init__ would render an empty body and set its headers, to be corrected after:
        # the same attributes, set once.
        self.status_code = status_code
        self.media_type = body.media_type
        self.background = None
        self.body = b""
        length = body.length
        chunks = body.chunks
        if len(chunks) > 1 and length <= JOIN_BYTES:
            chunks = [b"".join(chunks)]  # a small answer: one write to the socket, not one per tensor
        self._chunks = chunks
        self.raw_headers = [
            (b"content-length", str(length).encode()),
            (b"content-type", body.media_type.encode("latin-1")),
            *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in body.headers.items()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        if scope.get("method") == "HEAD":
            await send({"type": "http.response.body", "body": b""})
            return
        last = len(self._chunks) - 1
        for i, chunk in enumerate(self._chunks):
            await send({"type": "http.response.body", "body": chunk, "more_body": i < last})
