"""``python -m service`` / ``lu-service``: parse flags and LU_ settings, open the port, then serve.

The order matters to orchestrators: the port is bound before anything slow happens
(importing lu_core and Numba, picking the device, warm-up), so a busy port fails at
once with a clear message, and ``/readyz`` answers 503 while warm-up runs in the
background instead of the connection being refused.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import io
import logging
import resource
import signal
import socket
import sys
import threading
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from service.cli import build_parser, overrides
from service.config import Settings
from service.logs import configure_logging

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger("service")

# Exit statuses: 2 for what the operator must change (flags, settings, a missing GPU), 1 for the port.
EXIT_CONFIG = 2
EXIT_LISTEN = 1


#: Files the process needs besides its connections (libraries, logs, the listening sockets, gRPC's own).
FILE_SLACK = 256


def raise_file_limit(max_connections: int) -> int:
    """Raise the soft limit on open files to what the connection bounds may take: ``LU_MAX_CONNECTIONS``
    served and as many turned away on the HTTP port, as many on gRPC's, and :data:`FILE_SLACK`; as far as
    the hard limit allows (the soft one is often 1024, LU_MAX_CONNECTIONS's default). Below that, accept()
    fails (EMFILE) before the count turns anyone away: logged. Returns the soft limit now."""
    needed = 3 * max_connections + FILE_SLACK
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft
    target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # pragma: no cover - a platform that refuses
            log.warning("cannot raise the open-file limit to %d: %s", target, exc)
    if soft < needed:
        log.warning(
            "the open-file limit (%d, hard %d) is below the %d that LU_MAX_CONNECTIONS = %d may need: raise it "
            "(ulimit -n, compose's ulimits, the container runtime) or lower LU_MAX_CONNECTIONS",
            soft,
            hard,
            needed,
            max_connections,
        )
    return soft


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``; raises :class:`OSError` (address in use, bad address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # As uvicorn does: a restart may reuse a port whose old connections sit in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def main(argv: list[str] | None = None) -> int:
    # A crash in native code (BLAS, Numba, CUDA) prints every thread's Python stack to stderr, and
    # so does SIGUSR1 without stopping anything (what is a slow request doing?) (where stderr is a
    # file: not when main() runs inside a test that captures it).
    with contextlib.suppress(io.UnsupportedOperation, AttributeError, ValueError):
        faulthandler.enable()
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    args = build_parser().parse_args(argv)
    try:
        settings = Settings(**overrides(args))
    except ValidationError as exc:
        print(f"lu-service: invalid settings:\n{exc}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(settings.log_level, settings.log_json)
    raise_file_limit(settings.max_connections)
    try:
        sock = listen(settings.host, settings.port)
    except OSError as exc:
        log.error(
            "cannot listen on %s:%d: %s (is another server using it? pick another with --port or LU_PORT)",
            settings.host,
            settings.port,
            exc.strerror or exc,
        )
        return EXIT_LISTEN
    log.info(
        "listening on http://%s:%d (authentication %s)",
        settings.host,
        sock.getsockname()[1],
        f"on: {len(settings.api_keys)} key(s)" if settings.api_keys else "off: LU_API_KEY unset or empty",
    )

    # Imported here, after the port is ours: these take seconds on a cold start.
    import uvicorn

    from service.app import create_app
    from service.device import DeviceUnavailableError

    try:
        app = create_app(settings)
    except DeviceUnavailableError as exc:
        log.error("%s", exc)
        sock.close()
        return EXIT_CONFIG
    freeze_heap_when_ready(app.state.ready)
    server = uvicorn.Server(server_config(app, settings, metrics=app.state.metrics))
    server.run(sockets=[sock])
    return 0


def freeze_heap_when_ready(ready: threading.Event) -> threading.Thread:
    """Once the service is ready (warm-up done), move every object that exists then out of the cyclic
    garbage collector's sight (``gc.freeze``).

    What start-up builds (imports, Numba's compiled kernels, FastAPI's routes) lives as long as the
    process, yet each full collection walks it: ~175,000 objects, ~130 ms on the 2-vCPU machine, a
    stall that every request in flight pays (it was the p99 of small requests under load). Only
    the real server does this: tests build many apps in one process and must not pin their garbage.
    """

    def freeze() -> None:
        ready.wait()
        gc.collect()  # what start-up left as garbage goes first, or it is kept for good
        gc.freeze()
        log.info("start-up heap frozen", extra={"objects": gc.get_freeze_count()})

    thread = threading.Thread(target=freeze, name="lu-gc-freeze", daemon=True)
    thread.start()
    return thread


def server_config(app: Any, settings: Settings, metrics: Any = None) -> uvicorn.Config:
    """The uvicorn configuration the service runs under (also used by ``bench.service``'s bare-ASGI baseline).

    ``metrics`` (the app's :class:`service.metrics.Metrics`) counts the protocol's refusals and the open
    connections.
    """
    import uvicorn

    from service.protocol import ConnectionGate, bounded_protocol

    on_refusal = metrics.protocol_refusal if metrics is not None else None
    gate = ConnectionGate(settings.max_connections, settings.retry_after_s, on_refusal)
    if metrics is not None:
        metrics.watch_connections(gate)
    protocol = bounded_protocol(
        read_timeout_s=settings.read_timeout_s,
        min_upload_rate=settings.min_upload_rate,
        keep_alive_s=settings.keep_alive_s,
        max_header_bytes=settings.max_header_bytes,
        on_refusal=on_refusal,
        gate=gate,
    )
    return uvicorn.Config(
        app,
        http=protocol,
        timeout_keep_alive=settings.keep_alive_s,
        log_config=None,  # configure_logging owns the format
        access_log=False,  # service.middleware writes one structured line per request
        timeout_graceful_shutdown=settings.graceful_shutdown_s,
        proxy_headers=True,
        # No WebSocket routes: an Upgrade request is answered as plain HTTP. (uvicorn would hand the
        # connection to its WebSocket protocol, whose close the connection count never sees.)
        ws="none",
    )


if __name__ == "__main__":
    sys.exit(main())
