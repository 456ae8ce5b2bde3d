"""The gRPC door: ``inference.GRPCInferenceService`` on ``LU_GRPC_PORT``, beside the HTTP routes.

A second protocol, not a second service: requests are decoded
(:mod:`service.grpc_codec`) into the same :class:`~service.codec.Decoded` objects
the HTTP routes make and go through the same :func:`service.pipeline.compute`
(options, deadline, output bound) to the same worker. Authentication, request
ids, metrics, logs and the error model are the HTTP ones; a
:class:`~service.errors.ServiceError` becomes a gRPC status through one table,
:data:`GRPC_STATUS`. The server is ``grpcio``'s asyncio server, run on the
event loop uvicorn runs, started and stopped by the app's lifespan.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from fastapi import FastAPI
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

import lu_core
from service.auth import check_authorization
from service.codec import check_outputs_known
from service.context import choose_request_id, request_id_var
from service.errors import ServiceError, from_core, unavailable
from service.footprint import REQUEST_OVERHEAD, body_bytes
from service.grpc_codec import decode_infer_request, encode_infer_response
from service.logs import ACCESS, log_access
from service.metadata import VERSION, find_model, model_metadata, server_metadata
from service.pipeline import compute
from service.transport import offload

__all__ = ["GRPC_STATUS", "GrpcServer", "grpc_status"]

log = logging.getLogger("service.grpc")

Code = grpc.StatusCode

# The one table from the service's errors to gRPC status codes: a stable error code listed
# here wins, otherwise its HTTP status decides. User input never maps to UNKNOWN or INTERNAL.
GRPC_STATUS: dict[str | int, grpc.StatusCode] = {
    "shutting_down": Code.UNAVAILABLE,
    "not_ready": Code.UNAVAILABLE,
    400: Code.INVALID_ARGUMENT,
    401: Code.UNAUTHENTICATED,
    404: Code.NOT_FOUND,
    408: Code.DEADLINE_EXCEEDED,
    413: Code.RESOURCE_EXHAUSTED,
    415: Code.INVALID_ARGUMENT,
    422: Code.INVALID_ARGUMENT,
    503: Code.RESOURCE_EXHAUSTED,  # overloaded, out of memory: back off and retry
    501: Code.UNIMPLEMENTED,  # an RPC of the protocol this service does not serve
    500: Code.INTERNAL,  # a bug, never input
}

SERVICE = "inference.GRPCInferenceService"
_OPEN = frozenset({"ServerLive", "ServerReady"})  # as /v2/health/*: no API key

#: The service's RPCs that it does not serve (Triton's model configuration and statistics, model
#: repository, shared memory, tracing, logging and streaming extensions): UNIMPLEMENTED, through
#: the same access log line, metrics and authentication as every other RPC.
UNSERVED = (
    "ModelConfig",
    "ModelStatistics",
    "RepositoryIndex",
    "RepositoryModelLoad",
    "RepositoryModelUnload",
    "SystemSharedMemoryStatus",
    "SystemSharedMemoryRegister",
    "SystemSharedMemoryUnregister",
    "CudaSharedMemoryStatus",
    "CudaSharedMemoryRegister",
    "CudaSharedMemoryUnregister",
    "TraceSetting",
    "LogSettings",
    "ModelStreamInfer",
)
_MAX_MESSAGE = (1 << 31) - 1  # protobuf's own bound


def grpc_status(error: ServiceError) -> grpc.StatusCode:
    """The gRPC status of a service error (:data:`GRPC_STATUS`)."""
    return GRPC_STATUS.get(error.code) or GRPC_STATUS.get(error.status, Code.INTERNAL)


def _as_service_error(exc: Exception) -> ServiceError:
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, lu_core.LinAlgError):
        return from_core(exc)
    log.error("unhandled error", exc_info=exc)
    return ServiceError(500, "internal_error", "internal server error; see the server log")


Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """The health, metadata and inference RPCs of the protocol, over the app's state."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.state = app.state

    # ------------------------------------------------------------------ the RPCs

    async def ServerLive(self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext) -> Any:
        return await self._serve("ServerLive", request, context, self._live)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext) -> Any:
        return await self._serve("ServerReady", request, context, self._ready)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext) -> Any:
        return await self._serve("ModelReady", request, context, self._model_ready)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext) -> Any:
        return await self._serve("ServerMetadata", request, context, self._server_metadata)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext) -> Any:
        return await self._serve("ModelMetadata", request, context, self._model_metadata)

    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> Any:
        return await self._serve("ModelInfer", request, context, self._infer)

    async def _unserved(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
            raise ServiceError(501, "not_implemented", f"{method} is not served here: {SERVICE} serves {_SERVED}")

        return await self._serve(method, request, context, refuse)

    # ------------------------------------------------------------------ what they do

    async def _live(self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def _ready(self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext) -> Any:
        return pb.ServerReadyResponse(ready=self.state.ready.is_set())

    async def _model_ready(self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext) -> Any:
        find_model(request.name, request.version)
        return pb.ModelReadyResponse(ready=self.state.ready.is_set())

    async def _server_metadata(self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext) -> Any:
        s = self.state.settings
        meta = server_metadata(self.app.version, s.max_request_bytes, s.max_elements)
        return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"], extensions=meta["extensions"])

    async def _model_metadata(self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext) -> Any:
        meta = model_metadata(find_model(request.name, request.version))

        def tensors(entries: list[dict[str, Any]]) -> list[Any]:
            return [pb.ModelMetadataResponse.TensorMetadata(**t) for t in entries]

        return pb.ModelMetadataResponse(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=tensors(meta["inputs"]),
            outputs=tensors(meta["outputs"]),
        )

    async def _infer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> Any:
        settings = self.state.settings
        if not self.state.ready.is_set():
            raise unavailable("not_ready", "the service is not ready (warming up or stopping)", settings.retry_after_s)
        op = find_model(request.model_name, request.model_version)
        # The message is already here (grpcio bounded it by LU_MAX_REQUEST_BYTES); its memory and what
        # decoding makes of it are reserved as an HTTP body's are, held until the answer has been sent.
        # (ByteSize, not the raw contents' lengths: each access to a bytes field copies it.)
        size = request.ByteSize()
        reservation = self.state.budget.reserve(body_bytes("binary", size), "this gRPC message")
        context.add_done_callback(lambda _: reservation.release())
        decoded = await offload(size, decode_infer_request, request, settings.max_elements)
        check_outputs_known(decoded, op.outputs)
        remaining = context.time_remaining()
        deadline = None if remaining is None else time.monotonic() + remaining
        outputs = await compute(self.state, op, decoded, reservation=reservation, deadline=deadline)
        out_bytes = sum(v.nbytes for v in outputs.values() if v is not None)
        return await offload(out_bytes, encode_infer_response, op.name, VERSION, decoded, outputs)

    # ------------------------------------------------------------------ shared by every RPC

    async def _serve(self, method: str, request: Any, context: grpc.aio.ServicerContext, handler: Handler) -> Any:
        """Request id, API key, metrics, access log and the error table around one RPC."""
        metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        rid = choose_request_id(metadata.get("x-request-id"))
        token = request_id_var.set(rid)
        metrics = self.state.metrics
        metrics.in_flight.inc()
        start = time.perf_counter()
        status = "CANCELLED"  # unless it ends otherwise
        out = 0
        try:
            if method not in _OPEN:
                check_authorization(metadata.get("authorization", ""), self.state.settings.api_keys)
            if isinstance(request, Malformed):
                raise ServiceError(400, "malformed_request", f"the message is not a valid {method} request: {request}")
            response = await handler(request, context)
            out = response.ByteSize()
            status = Code.OK.name
            context.set_trailing_metadata((("x-request-id", rid),))
            return response
        except Exception as exc:
            error = _as_service_error(exc)
            code = grpc_status(error)
            status = code.name
            metrics.errors.labels(error.code).inc()
            if error.status >= 500 and error.status != 501:
                log.warning("%s: %s", error.code, error.message)
            trailing = [("x-request-id", rid), ("lu-error-code", error.code)]
            trailing += [(k.lower(), v) for k, v in error.headers.items() if k.lower() == "retry-after"]
            context.set_trailing_metadata(tuple(trailing))
            await context.abort(code, error.message)
        finally:
            seconds = time.perf_counter() - start
            path = f"/{SERVICE}/{method}"
            size = request.ByteSize() if hasattr(request, "ByteSize") else 0  # (a stream's: not read)
            metrics.in_flight.dec()
            metrics.observe_request(path, "gRPC", status, seconds, size, out)
            if ACCESS.isEnabledFor(logging.INFO):
                log_access(
                    "gRPC %s %s",
                    (method, status),
                    {"method": "gRPC", "path": path, "status": status, "duration_ms": round(seconds * 1000, 3),
                     "bytes_in": size, "bytes_out": out},
                )  # fmt: skip
            request_id_var.reset(token)


class Malformed(str):
    """A message protobuf could not parse, handed to the servicer in its place (the parser's words) so that the
    RPC is answered INVALID_ARGUMENT in the error model: a deserializer that raises makes grpcio answer UNKNOWN
    itself, naming the exception's class."""

    def __new__(cls, reason: str, size: int) -> Malformed:
        self = super().__new__(cls, reason)
        self.size = size
        return self

    def ByteSize(self) -> int:  # a protobuf message's method, for the access log
        return self.size


def _lenient(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:  # DecodeError (upb); UnicodeDecodeError too with protobuf's pure-Python parser
            return Malformed(f"{type(exc).__name__}: {str(exc)[:200]}", len(data))

    return deserialize


def add_servicer(servicer: InferenceServicer, server: grpc.aio.Server) -> None:
    """``pb_grpc.add_GRPCInferenceServiceServicer_to_server``, each request parsed leniently (:class:`Malformed`)."""

    class Capture:
        def __init__(self) -> None:
            self.handlers: dict[str, grpc.RpcMethodHandler] = {}

        def add_generic_rpc_handlers(self, handlers: Any) -> None:
            pass

        def add_registered_method_handlers(self, name: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
            assert name == SERVICE
            self.handlers = handlers

    capture = Capture()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, capture)
    if not capture.handlers:  # pragma: no cover - a tritonclient whose generated code registers otherwise
        raise RuntimeError("tritonclient's gRPC registration did not list its method handlers")
    handlers = {
        name: handler._replace(request_deserializer=_lenient(handler.request_deserializer))
        for name, handler in capture.handlers.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


def _refusing(method: str) -> Callable[..., Awaitable[Any]]:
    async def rpc(self: InferenceServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._unserved(method, request, context)

    rpc.__name__ = method
    return rpc


for _method in UNSERVED:
    setattr(InferenceServicer, _method, _refusing(_method))
_SERVED = ", ".join(
    m for m in vars(pb_grpc.GRPCInferenceServiceServicer) if not m.startswith("_") and m not in UNSERVED
)


#: The fewest RPCs served at once, whatever the budget.
MIN_CONCURRENT_RPCS = 16
#: Bytes a message takes while grpcio receives it, per byte of message (the compressed frames, the
#: inflated buffer, its copy into Python bytes, the parsed protobuf, the decoded tensors): measured
#: 32 gzip-compressed 10 MiB calls at once, refused after decoding, peaking 938 MiB over the process's
#: start under a 512 MiB budget with 3 here; the bounds below use this factor.
GRPC_MESSAGE_FACTOR = 6


def max_message_bytes(settings: Any) -> int:
    """The largest message grpcio takes: ``LU_MAX_REQUEST_BYTES``, and at most what lets
    :data:`MIN_CONCURRENT_RPCS` messages, each held at :data:`GRPC_MESSAGE_FACTOR`, fit in ``LU_MAX_INFLIGHT_BYTES``."""
    fair = settings.max_inflight_bytes // (MIN_CONCURRENT_RPCS * GRPC_MESSAGE_FACTOR)
    return max(1, min(settings.max_request_bytes, _MAX_MESSAGE, fair))


def max_concurrent_rpcs(settings: Any) -> int:
    """How many RPCs grpcio serves at once (RESOURCE_EXHAUSTED beyond), health checks included: as many whole
    messages of the largest size, each held at :data:`GRPC_MESSAGE_FACTOR`, as LU_MAX_INFLIGHT_BYTES holds (and
    :data:`MIN_CONCURRENT_RPCS` at least, which :func:`max_message_bytes` makes fit). grpcio receives (and
    inflates) a message whole before the servicer can reserve for it: 32 gzip-compressed 60 MiB calls at once
    took the process 5.7 GB past a 512 MiB budget (found by a helper's audit)."""
    held = GRPC_MESSAGE_FACTOR * max_message_bytes(settings) + REQUEST_OVERHEAD
    return max(MIN_CONCURRENT_RPCS, settings.max_inflight_bytes // held)


class GrpcServer:
    """grpcio's asyncio server for one app, on ``LU_HOST:LU_GRPC_PORT``; started and stopped by the lifespan."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.port = 0
        self._server: grpc.aio.Server | None = None

    async def start(self) -> int:
        """Bind and serve (on the running event loop); returns the bound port."""
        settings = self.app.state.settings
        limit, message = max_concurrent_rpcs(settings), max_message_bytes(settings)
        server = grpc.aio.server(
            maximum_concurrent_rpcs=limit,
            options=[
                # The body bound of HTTP (lower where the budget is small): a larger message is refused
                # (RESOURCE_EXHAUSTED) before it is parsed.
                ("grpc.max_receive_message_length", message),
                ("grpc.max_send_message_length", _MAX_MESSAGE),
                # LU_MAX_CONNECTIONS bounds gRPC's connections as it does HTTP's (grpc core closes
                # the ones beyond it as they are accepted).
                ("grpc.max_allowed_incoming_connections", settings.max_connections),
            ],
        )
        add_servicer(InferenceServicer(self.app), server)
        address = f"{settings.host}:{settings.grpc_port}"
        try:
            self.port = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"LU_GRPC_PORT: cannot listen on {address}: {exc}") from None
        await server.start()
        self._server = server
        log.info(
            "gRPC on %s (at most %d RPCs at once, messages up to %d bytes)",
            address,
            limit,
            message,
            extra={"grpc_port": self.port, "rpcs": limit, "max_message_bytes": message},
        )
        return self.port

    async def stop(self, grace: float) -> None:
        """Refuse new RPCs, let those in flight finish for up to ``grace`` seconds."""
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
