"""The application factory: ``create_app(settings)`` builds a service around one device worker."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
import numpy as np
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

import lu_core
from service.bodies import BodyPool
from service.budget import MemoryBudget
from service.config import Settings
from service.device import Device, select_device
from service.errors import install_handlers
from service.grpc_server import GrpcServer
from service.hot_routes import HotRoutes, hot_routes
from service.metrics import Metrics
from service.middleware import RequestMiddleware
from service.operations import OPERATIONS
from service.routes import docs, factorizations, health, native, v2
from service.schemas import install_components
from service.worker import DeviceWorker

__all__ = ["create_app"]

log = logging.getLogger("service")

WARMUP_DTYPES = (np.float32, np.float64, np.complex64, np.complex128)


# (batch, n) of the warm-up's matrices: small batches take the kernels' serial twins, large ones
# (past lu_core's PARALLEL_MIN_WORK) their parallel twins, which would otherwise be loaded or
# compiled on the first large request; n = 4 unpacks in the fused kernel, n = 24 in the split ones;
# a batch of 10 4x4 matrices factors eight in SIMD lanes and two one by one (lu_core._cpu._lanes).
# (4, 160) is over lu_core's FACTOR_KERNEL_MAX_N: LAPACK's getrf on the CPU. On a GPU the small shapes
# take our own kernels; (1, 64), (4, 64) and (4, 160) reach cuSOLVER getrf / getrs and cuBLAS
# getrfBatched / trsmBatched (lu_core/_gpu/_tuning.py's factor_path and solve_path; getrsBatched
# where GETRS_BATCHED_MAX_N reaches n = 64: not since the H100's calibration; the test
# test_the_warm_up_reaches_every_gpu_routine checks that every routine the table can choose is
# reached), whose libraries load on first use. Batch ``None``: one matrix without a batch dimension,
# the commonest request; batch 1 of n = 8: one matrix with a batch dimension, whose kernel factor returns
# the batched shapes itself (lu_core._cpu._kernels.getrf_one_batched; for complex dtypes (1, 64) is LAPACK's).
# CuPy compiles its elementwise and reduction kernels (the singular check's
# comparison, any and argmax over diag(U), the casts) once per number of dimensions, so after a
# warm-up of batched shapes only, the first unbatched request compiled its own: on a fresh H100 the
# first 5792 x 5792 ``/lu_solve`` spent 5.8-6.3 s in compute, the library alone 3 ms once its CuPy
# kernels were cached (the likely cause, not yet confirmed on a device: the GPU proof dumps the
# server's stacks if that first request still takes seconds).
WARMUP_SHAPES = (
    (10, 4), (16384, 4), (2, 24), (1024, 24), (1, 8), (1, 64), (4, 64), (4, 160), (None, 8), (None, 64)
)  # fmt: skip


def warmup_shape(batch: int | None, n: int) -> tuple[int, ...]:
    """The shape of an ``n x n`` warm-up matrix: ``(n, n)`` for batch ``None``, else ``(batch, n, n)``."""
    return (n, n) if batch is None else (batch, n, n)


def _as_body(x: Any) -> Any:
    """``x`` as a binary request would bring it: read-only over bytes (anything but a host array, as it is)."""
    if not isinstance(x, np.ndarray):
        return x
    return np.frombuffer(np.ascontiguousarray(x).tobytes(), dtype=x.dtype).reshape(x.shape)


def warm_up(device: Device, max_n: int | None = None, *, refined: bool | None = None) -> float:
    """Run every operation per dtype and kernel path (JIT-compiles the CPU kernels, loads the GPU modules);
    ``max_n``: only the shapes up to that order; ``refined``: run ``solve_refined`` too (default: on a
    CPU device, the only one that refines on the host).

    On a GPU service the small shapes are computed on the host (``LU_GPU_HOST_MAX_N``): they run once
    as routed (the CPU kernels) and once more on the device (our own kernels, which stored
    factorizations, rectangular and refined requests still reach)."""
    start = time.perf_counter()
    rng = np.random.default_rng(0)
    if refined is None:
        refined = device.kind == "cpu"

    def run(name: str, tensors: dict[str, Any]) -> dict[str, Any]:
        return device.run(OPERATIONS[name].compute, tensors, OPERATIONS[name].defaults())

    def shapes(max_n: int | None = None) -> None:
        for dtype, (batch, n) in itertools.product(WARMUP_DTYPES, WARMUP_SHAPES):
            if max_n is not None and n > max_n:
                continue
            # As a binary request brings them: read-only views of its body (the device hands every
            # request's tensors to the kernels read-only: service.device.read_only).
            shape = warmup_shape(batch, n)
            A = _as_body((rng.standard_normal(shape) + n * np.eye(n)).astype(dtype))
            B = _as_body(rng.standard_normal((*shape[:-1], 1)).astype(dtype))
            factored = run("lu_factor", {"A": A})
            lu, piv = _as_body(factored["LU"]), _as_body(factored["pivots"])
            run("lu_unpack", {"LU": lu, "pivots": piv})
            run("lu_solve", {"LU": lu, "pivots": piv, "B": B})
            if dtype == WARMUP_DTYPES[0]:
                # Pivots sent as a JSON list decode to int64 (service.codec), LAPACK's and ours are int32:
                # the pivot check has a build per pivot dtype (and none per matrix dtype).
                piv64 = _as_body(np.asarray(factored["pivots"]).astype(np.int64))
                run("lu_unpack", {"LU": lu, "pivots": piv64})
                run("lu_solve", {"LU": lu, "pivots": piv64, "B": B})
            run("solve", {"A": A, "B": B})
            run("lu", {"A": A})  # it unpacks its own (writable) factorization: other builds of the unpacking
            # solve_refined's own CPU kernels (the fused refinement up to n = 32, the cast and the
            # residual above; lu_rcond, slogdet and det reuse the factorization's). A GPU service
            # refines every size on the device (never on the host), where it has not yet run behind
            # a warm-up: not there.
            if refined:
                run("solve_refined", {"A": A, "B": B})

    shapes(max_n)
    host_max_n = getattr(device, "host_max_n", 0)
    if host_max_n:
        device.host_max_n = 0  # type: ignore[attr-defined]  # the worker runs nothing else meanwhile
        try:
            shapes(host_max_n if max_n is None else min(host_max_n, max_n))
        finally:
            device.host_max_n = host_max_n  # type: ignore[attr-defined]
    return time.perf_counter() - start


class ServiceApp(FastAPI):
    """FastAPI, with the compute routes served ahead of its middleware stack and router.

    A request :class:`~service.hot_routes.HotRoutes` claims goes through ``hot_front``
    (:class:`~service.middleware.RequestMiddleware` around the endpoint's call); every
    other request, and the lifespan, through FastAPI (where the same middleware runs
    inside Starlette's). On a small request, FastAPI's layers (its telemetry and body-limit
    wrappers, the exception middleware, the route matching, the dependency solving) each
    cost a coroutine frame resumed at every ``await`` and together more than the request.

    The shortcut is only taken where FastAPI would do nothing more: not while
    ``dependency_overrides`` holds anything (checked per request), and not at all
    (decided once, when Starlette builds the middleware stack, before the first request)
    when middleware other than the one ``RequestMiddleware`` was added, when the app has a
    ``root_path`` or when FastAPI's ``max_body_size`` is set.
    """

    hot: HotRoutes | None = None
    hot_front: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.middleware_stack is None:  # as Starlette does, but here: it decides whether hot routes are served
            self.middleware_stack = self.build_middleware_stack()
        hot = self.hot
        if hot is not None and self.hot_front is not None and not self.dependency_overrides and hot.claim(scope):
            scope["app"] = self
            await self.hot_front(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    def build_middleware_stack(self) -> ASGIApp:
        stack = super().build_middleware_stack()
        reason = self._hot_routes_refused()
        if reason is not None and self.hot is not None:
            log.info("compute routes served through FastAPI's router: %s", reason)
            self.hot = self.hot_front = None
        return stack

    def _hot_routes_refused(self) -> str | None:
        """Why FastAPI would do more for a compute route than the shortcut does, or None."""
        classes = [m.cls for m in self.user_middleware]
        if classes != [RequestMiddleware]:
            names = ", ".join(getattr(c, "__name__", repr(c)) for c in classes)
            return f"the app's middleware is [{names}], not RequestMiddleware alone (the rest would be skipped)"
        if self.root_path:
            return f"root_path {self.root_path!r} is set"
        if getattr(self, "max_body_size", None) is not None:
            return "FastAPI's max_body_size is set"
        return None


def create_app(settings: Settings | None = None) -> ServiceApp:
    """Build the app; picks the device now (``LU_DEVICE=gpu`` without a GPU raises here)."""
    settings = settings or Settings()
    device = select_device(settings)
    metrics = Metrics(device.kind, device.name)
    budget = MemoryBudget(settings.max_inflight_bytes, retry_after_s=settings.retry_after_s)
    metrics.watch_budget(budget)
    device.attach_metrics(metrics)
    worker = DeviceWorker(
        device,
        metrics,
        max_queue=settings.max_queue,
        retry_after_s=settings.retry_after_s,
        max_batch=settings.max_batch,
        batch_delay_us=settings.batch_delay_us,
        max_batch_elements=settings.max_batch_elements,
    )
    ready = threading.Event()

    def set_ready() -> None:
        log.info("ready on the %s (%s)", device.kind.upper(), device.name, extra={"device": device.describe()})
        ready.set()

    def warm_then_ready() -> None:
        # Runs beside the event loop: the port already answers, /readyz says 503 until this ends.
        # Requests that arrive meanwhile queue behind the warm-up job on the worker.
        try:
            seconds = worker.call(lambda: warm_up(device))
        except Exception:
            log.exception("warm-up failed; /readyz stays 503")
            return
        log.info("warm-up done in %.2f s", seconds)
        set_ready()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        worker.start()
        warming = threading.Thread(target=warm_then_ready, name="lu-warm-up", daemon=True)
        # The gRPC door opens with HTTP (ServerLive answers, ServerReady says false while warming up).
        grpc_door = GrpcServer(app) if settings.grpc_port else None
        app.state.grpc = grpc_door
        if grpc_door is not None:
            await grpc_door.start()
        if settings.warmup:
            warming.start()
        else:
            set_ready()
        try:
            async with factorizations.sweeping(app.state.store):
                yield
        finally:
            ready.clear()
            # uvicorn has already drained in-flight HTTP requests; drain the gRPC ones, then finish
            # whatever is still queued (a warm-up still running included, so the worker stops between jobs).
            if grpc_door is not None:
                await grpc_door.stop(settings.graceful_shutdown_s)
            await anyio.to_thread.run_sync(worker.stop, settings.graceful_shutdown_s)
            if warming.is_alive():
                await anyio.to_thread.run_sync(warming.join, settings.graceful_shutdown_s)
            ready.clear()
            log.info("stopped")

    app = ServiceApp(
        title="lu-service",
        version=lu_core.__version__,
        summary="Batched LU factorization, unpacking and solves with PyTorch semantics, over HTTP.",
        lifespan=lifespan,
        # Served by routes/docs.py, behind the API key unless LU_DOCS_PUBLIC.
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.device = device
    app.state.metrics = metrics
    app.state.worker = worker
    app.state.ready = ready
    app.state.budget = budget
    # Request bodies are received into buffers reused across requests (service.bodies, transport.read_body).
    # On a GPU the pool's idle buffers are page-locked in the background, so that later bodies received into
    # them are uploaded without staging (service.pinning).
    app.state.bodies = BodyPool(settings.body_pool_bytes, budget, device.body_pinner())
    metrics.watch_body_pool(app.state.bodies)
    install_handlers(app)
    app.include_router(health.router)
    app.include_router(health.metrics_router)
    app.include_router(v2.health_router)
    app.include_router(v2.router)
    app.include_router(native.router)
    app.include_router(docs.router)
    factorizations.install(app, settings, device, metrics)
    install_components(app)
    app.add_middleware(RequestMiddleware, settings=settings, budget=budget, metrics=metrics)
    # The routes as the app serves them (after include_router), picked by the compute routers' endpoints.
    declared = hot_routes([*native.router.routes, *v2.router.routes, *factorizations.router.routes])
    served = hot_routes(app.router.routes, endpoints={r.endpoint for r in declared})
    if len(served) != len(declared):  # pragma: no cover - a compute route not included in the app
        raise RuntimeError(f"hot routes: {len(declared)} declared, {len(served)} served by the app")
    app.hot = HotRoutes(served, api_keys=settings.api_keys, metrics=metrics)
    app.hot_front = RequestMiddleware(app.hot, settings=settings, budget=budget, metrics=metrics)
    return app
