"""Stored factorizations: PUT, GET, DELETE ``/factorizations/{name}``, its ``/solve`` and ``/unpack``.

The bodies are those of ``/lu_factor``, ``/lu_solve`` (without ``LU`` and
``pivots``) and ``/lu_unpack`` (options only), decoded and encoded by the same
codec and computed by the same :data:`~service.operations.OPERATIONS` on the
device worker; the factorization itself stays in the worker's memory
(:mod:`service.store`). Names live in the caller's namespace (its API key).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import numpy as np
import orjson
from fastapi import APIRouter, Depends, FastAPI, Request
from starlette.responses import Response

from service.auth import require_api_key
from service.codec import Decoded
from service.config import Settings
from service.device import Compute, Device, Resident, read_only
from service.errors import invalid
from service.metrics import Metrics
from service.middleware import reservation_of
from service.operations import OPERATIONS, Operation
from service.pipeline import compute, connection_of, decode_native, encode_native
from service.schemas import native_openapi
from service.store import Entry, FactorizationStore, Pin, check_name, namespace_of, unknown_factorization

__all__ = ["install", "router"]

router = APIRouter(prefix="/factorizations", dependencies=[Depends(require_api_key)], tags=["stored factorizations"])

FACTOR, SOLVE, UNPACK = OPERATIONS["lu_factor"], OPERATIONS["lu_solve"], OPERATIONS["lu_unpack"]
GiB = 1 << 30
# The factor routine's dtypes; anything else is promoted to float64 (integers) or refused by lu_core.
_KEPT_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.complex64, np.complex128))


_META: dict[str, Any] = {
    "type": "object",
    "required": ["name", "shape", "dtype", "nbytes", "expires_at"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer"}},
        "dtype": {"type": "string"},
        "nbytes": {"type": "integer"},
        "pivot": {"type": "boolean"},
        "created_at": {"type": "string", "format": "date-time"},
        "idle_ttl_s": {"type": ["number", "null"]},
        "expires_in_s": {"type": ["number", "null"], "description": "if left unused; null: never"},
        "expires_at": {"type": ["string", "null"], "format": "date-time"},
        "info": {"type": "object", "description": "as in /lu_factor (not in the list)"},
    },
}


def _docs(op: Operation, inputs: tuple[str, ...], *, body_required: bool = True) -> dict[str, Any]:
    """The OpenAPI text of ``op`` with the inputs a stored factorization leaves to the client."""
    extra = native_openapi(dataclasses.replace(op, inputs=inputs))
    extra["requestBody"]["required"] = body_required
    extra["responses"]["404"] = {"description": "unknown_factorization: never stored, deleted, expired or evicted"}
    return extra


def _put_docs() -> dict[str, Any]:
    extra = _docs(FACTOR, FACTOR.inputs)
    meta = {"content": {"application/json": {"schema": _META}}}
    extra["responses"].pop("200")
    extra["responses"].pop("404")
    extra["responses"]["200"] = {"description": "Replaced.", **meta}
    extra["responses"]["201"] = {"description": "Stored.", **meta}
    extra["responses"]["413"]["description"] += " factorization_too_large: larger than LU_STORE_BYTES."
    return extra


# --------------------------------------------------------------------------- wiring


def default_store_bytes(device: Device, settings: Settings) -> int:
    """1 GiB on the CPU, a quarter of the device's memory on a GPU; at most half of LU_MAX_INFLIGHT_BYTES.

    Stored bytes are reserved in the in-flight budget, so a store allowed the whole budget
    could leave nothing for requests.
    """
    memory = device.describe().get("memory_bytes")
    base = int(memory) // 4 if device.kind == "gpu" and memory else GiB
    return min(base, settings.max_inflight_bytes // 2)


def install(app: FastAPI, settings: Settings, device: Device, metrics: Metrics) -> FactorizationStore:
    """Create the store (``app.state.store``), its routes and metrics."""
    limit = default_store_bytes(device, settings) if settings.store_bytes == "auto" else settings.store_bytes
    store = FactorizationStore(
        limit, settings.store_ttl_s, max_entries=settings.store_max_entries, budget=getattr(app.state, "budget", None)
    )
    app.state.store = store
    metrics.watch_store(store)
    # Stored factorizations stay on the device: a request has its memory limit less their bytes.
    device.resident_bytes = lambda: store.held_bytes
    app.include_router(router)
    return store


@asynccontextmanager
async def sweeping(store: FactorizationStore) -> AsyncIterator[None]:
    """Expire idle entries in the background (lookups also expire them), and drop all at shutdown."""

    async def sweep() -> None:
        period = max(1.0, min(60.0, store.ttl_s / 4))  # lookups expire exactly; this only frees memory
        while True:
            await anyio.sleep(period)
            store.expire()

    async with anyio.create_task_group() as tg:
        if store.ttl_s > 0:
            tg.start_soon(sweep)
        try:
            yield
        finally:
            tg.cancel_scope.cancel()
            store.clear()


# --------------------------------------------------------------------------- helpers


def _namespace(request: Request) -> str:
    """The caller's namespace; ``require_api_key`` has already checked the key."""
    if not request.app.state.settings.api_keys:
        return ""
    _, _, token = request.headers.get("authorization", "").partition(" ")
    return namespace_of(token.strip().encode())


def _factor_bytes(A: np.ndarray) -> int:
    """Bytes of ``LU`` and ``pivots`` for ``A``, known before factoring (0 when lu_core will refuse ``A``)."""
    if A.ndim < 2:
        return 0
    dtype = A.dtype if A.dtype in _KEPT_DTYPES else np.dtype(np.float64)
    batch = math.prod(A.shape[:-2])
    return A.size * dtype.itemsize + batch * min(A.shape[-2:]) * 4


def _factor_kept() -> Compute:
    """A factor job whose LU and pivots stay on the device.

    A new function per request: the dynamic batcher merges only jobs with the same compute
    function, and a kept factorization must not be stacked with others and split back.
    """

    def run(t: Mapping[str, Any], o: Mapping[str, bool]) -> dict[str, Any]:
        out = FACTOR.compute(t, o)
        # Kept read-only (host arrays, on a CPU service): nothing may write a stored factorization, and
        # its solves then use the kernels' one (read-only) build, as every request's tensors do.
        kept = read_only({"LU": out["LU"], "pivots": out["pivots"]})
        return {"factors": Resident((kept["LU"], kept["pivots"])), "info": out["info"]}

    return run


def _with_pin(pin: Pin, compute: Compute) -> Compute:
    """``compute`` on the pinned entry's LU and pivots; unpins when it ends (on the worker thread)."""

    def run(t: Mapping[str, Any], o: Mapping[str, bool]) -> dict[str, Any]:
        if not pin.begin():  # the route stopped waiting before the job started
            raise unknown_factorization(pin.entry.name)
        try:
            return compute({**t, "LU": pin.entry.LU, "pivots": pin.entry.pivots}, o)
        finally:
            pin.release()

    return run


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat(timespec="milliseconds")


def _metadata(store: FactorizationStore, entry: Entry, *, info: bool) -> dict[str, Any]:
    left = store.expires_in(entry)
    meta: dict[str, Any] = {
        "name": entry.name,
        "shape": list(entry.shape),
        "dtype": entry.dtype,
        "nbytes": entry.nbytes,
        "pivot": entry.pivot,
        "created_at": _iso(entry.created_at),
        "idle_ttl_s": store.ttl_s if store.ttl_s > 0 else None,
        "expires_in_s": left,
        "expires_at": None if left is None else _iso(datetime.datetime.now(datetime.timezone.utc).timestamp() + left),
    }
    if info:  # the object form of a tensor, as /lu_factor answers it (int32: always finite)
        meta["info"] = {"dtype": "int32", "shape": list(entry.info.shape), "data": entry.info.tolist()}
    return meta


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def _only_options(decoded: Decoded, what: str, allowed: tuple[str, ...] = ()) -> None:
    extra = sorted(set(decoded.tensors) - set(allowed))
    if extra:
        takes = f"only {', '.join(allowed)}" if allowed else "no tensors"
        raise invalid("unknown_input", f"{what} takes {takes}: LU and pivots come from the stored factorization")


# --------------------------------------------------------------------------- routes


@router.get("", summary="The caller's stored factorizations, most recently used first")
async def list_factorizations(request: Request) -> Response:
    store: FactorizationStore = request.app.state.store
    entries = store.names(_namespace(request))
    return _json({"factorizations": [_metadata(store, e, info=False) for e in entries]})


@router.put(
    "/{name}",
    summary="Factor A and store the factorization under name (replacing one of that name atomically)",
    description="Body of /lu_factor (A, pivot); answers 201 (new) or 200 (replaced) with the metadata.",
    openapi_extra=_put_docs(),
    response_class=Response,
    status_code=201,
)
async def put_factorization(request: Request, name: str) -> Response:
    check_name(name)
    state = request.app.state
    store: FactorizationStore = state.store
    namespace = _namespace(request)
    decoded = await decode_native(request, FACTOR.inputs)
    FACTOR.prepare(decoded.tensors, decoded.options, state.settings.max_elements)  # 4xx before reserving
    reservation = store.reserve(_factor_bytes(np.asarray(decoded.tensors["A"])))
    try:
        # The factorization is kept, not sent: its bytes are the store's reservation, not the answer's.
        out = await compute(
            request.app.state,
            FACTOR,
            decoded,
            reservation=reservation_of(request.scope),
            job=("factorization_put", _factor_kept()),
            answer=False,
            # No connection watch: the factorization is the store's once computed, held by the store's
            # reservation, which must outlive the job; a client that left is recorded 499 all the same.
        )
        LU, pivots = out["factors"].value
        entry = Entry(
            namespace=namespace,
            name=name,
            LU=LU,
            pivots=pivots,
            # A copy: on a GPU a large answer comes down into a leased pinned buffer (service.device
            # PinnedStaging.lease), which an entry would otherwise hold for its whole life.
            info=np.array(out["info"], dtype=np.int32, copy=True),
            pivot=decoded.options.get("pivot", True),
            shape=tuple(int(d) for d in LU.shape),
            dtype=str(LU.dtype),
            nbytes=int(LU.nbytes + pivots.nbytes),
            created_at=datetime.datetime.now(datetime.timezone.utc).timestamp(),
            reservation=reservation,
        )
        created, _ = store.put(entry)
    except BaseException:
        if reservation is not None:
            reservation.release()
        raise
    headers = {"Location": f"/factorizations/{name}"}
    return _json(_metadata(store, entry, info=True), 201 if created else 200, headers)


@router.get("/{name}", summary="Metadata of a stored factorization (not counted as a use)")
async def get_factorization(request: Request, name: str) -> Response:
    check_name(name)
    store: FactorizationStore = request.app.state.store
    return _json(_metadata(store, store.get(_namespace(request), name), info=True))


@router.delete("/{name}", summary="Delete a stored factorization", status_code=204, response_class=Response)
async def delete_factorization(request: Request, name: str) -> Response:
    check_name(name)
    request.app.state.store.delete(_namespace(request), name)
    return Response(status_code=204)


async def _serve_pinned(
    request: Request, name: str, op: Operation, tensor_names: tuple[str, ...], allowed: tuple[str, ...]
) -> Response:
    """Decode, pin the factorization, compute ``op`` on it on the worker, encode as the plain route would."""
    check_name(name)
    state = request.app.state
    store: FactorizationStore = state.store
    if request.headers.get("content-length") == "0" and not allowed:
        decoded = Decoded({}, {})  # options only, all defaulted: an empty body is fine
    else:
        decoded = await decode_native(request, tensor_names)
    _only_options(decoded, f"POST /factorizations/{{name}}/{op.name.removeprefix('lu_')}", allowed)
    pin = store.pin(_namespace(request), name)
    try:
        entry = pin.entry
        tensors = {"LU": entry.LU, "pivots": entry.pivots, **decoded.tensors}
        job = (f"factorization_{op.name}", _with_pin(pin, op.compute))
        out = await compute(
            request.app.state,
            op,
            decoded,
            reservation=reservation_of(request.scope),
            tensors=tensors,
            job=job,
            connection=connection_of(request),
        )
    finally:
        pin.abandon()
    return await encode_native(out, decoded.binary)


@router.post(
    "/{name}/solve",
    summary="Solve A X = B (or X A = B) with a stored factorization of A; as /lu_solve",
    description="Body: B, left, adjoint, check_errors (default true); answers X exactly as /lu_solve would.",
    openapi_extra=_docs(SOLVE, ("B",)),
    response_class=Response,
)
async def solve_factorization(request: Request, name: str) -> Response:
    return await _serve_pinned(request, name, SOLVE, ("B", "LU", "pivots"), ("B",))


@router.post(
    "/{name}/unpack",
    summary="P, L, U of a stored factorization; as /lu_unpack",
    description="Body: unpack_data, unpack_pivots (or empty); answers P, L, U as /lu_unpack would.",
    openapi_extra=_docs(UNPACK, (), body_required=False),
    response_class=Response,
)
async def unpack_factorization(request: Request, name: str) -> Response:
    return await _serve_pinned(request, name, UNPACK, ("LU", "pivots"), ())
