"""The bare-ASGI baseline of ``bench.service``: the service's server, an app that does nothing.

``python -m bench._bare_asgi`` listens like ``python -m service`` (same ``LU_`` settings,
same ``uvicorn.Config`` from ``service.__main__.server_config``, same protocol class from
``service/protocol.py``) but serves a plain ASGI callable that reads the request body and
answers a fixed body of ``LU_BARE_ANSWER_BYTES`` bytes (default 200, about an 8x8 solve's
binary answer) with the headers of a binary answer. What the service reaches against it,
with the same client in the same run, is the cost of everything above the server.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from service.__main__ import listen, server_config
from service.config import Settings


def bare_app(answer: bytes) -> Any:
    headers = [
        (b"content-type", b"application/octet-stream"),
        (b"inference-header-content-length", b"64"),
        (b"content-length", str(len(answer)).encode()),
    ]
    ready = [(b"content-type", b"application/json"), (b"content-length", b"2")]

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        more = True
        while more:  # the whole body, as an app must
            message = await receive()
            more = message.get("more_body", False) and message["type"] == "http.request"
        plain = scope["path"] == "/readyz"
        await send({"type": "http.response.start", "status": 200, "headers": ready if plain else headers})
        await send({"type": "http.response.body", "body": b"{}" if plain else answer})

    return app


def main() -> int:
    import uvicorn

    settings = Settings()
    answer = b"\0" * int(os.environ.get("LU_BARE_ANSWER_BYTES", "200"))
    sock = listen(settings.host, settings.port)
    uvicorn.Server(server_config(bare_app(answer), settings)).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
