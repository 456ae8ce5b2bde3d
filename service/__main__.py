"""``python -m service``: read the LU_ settings, pick the device, serve with uvicorn."""

from __future__ import annotations

import logging
import sys

import uvicorn
from pydantic import ValidationError

from service.app import create_app
from service.config import Settings
from service.device import DeviceUnavailableError
from service.logs import configure_logging
from service.protocol import bounded_protocol


def main() -> int:
    try:
        settings = Settings()
    except ValidationError as exc:
        print(f"lu-service: invalid LU_ settings:\n{exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_json)
    try:
        app = create_app(settings)
    except DeviceUnavailableError as exc:
        logging.getLogger("service").error("%s", exc)
        return 2
    protocol = bounded_protocol(
        read_timeout_s=settings.read_timeout_s,
        min_upload_rate=settings.min_upload_rate,
        keep_alive_s=settings.keep_alive_s,
        max_header_bytes=settings.max_header_bytes,
        on_refusal=app.state.metrics.protocol_refusal,
    )
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        http=protocol,
        timeout_keep_alive=settings.keep_alive_s,
        log_config=None,  # configure_logging owns the format
        access_log=False,  # service.middleware writes one structured line per request
        timeout_graceful_shutdown=settings.graceful_shutdown_s,
        proxy_headers=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
