"""The bare-ASGI baseline of ``bench.service``: the service's server, an app that does nothing.

``python -m bench._bare_asgi`` listens like ``python -m service`` (same ``LU_`` settings,
same ``uvicorn.Config`` from ``service.__main__.server_config``, same protocol class from
``service/protocol.py``) but serves a plain ASGI callable that reads the request body and
answers a fixed body of ``LU_BARE_ANSWER_BYTES`` bytes (default 200, about an 8x8 solve's
binary answer) with the headers of a binary answer. What the service reaches against it,
with the same client in the same run, is the cost of everything above the server.

With ``LU_BARE_COMPUTE=1`` the app does a request's own work instead, inline on the event
loop: it decodes the binary body with the service's codec (``service.codec.decode_binary``),
calls ``lu_core.solve`` and answers the binary encoding of X (``encode_binary``), and nothing
else: no admission, ids, metrics, worker thread or buffer pool. What it reaches is about the
most a Python service that computes can reach under this server on this machine.
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


def compute_app() -> Any:
    """Reads a binary ``/solve`` body, solves it inline and answers X binary (the request's own work alone)."""
    import lu_core
    from service.codec import decode_binary, encode_binary

    fixed = bare_app(b"")

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] == "/readyz":
            await fixed(scope, receive, send)
            return
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False) and message["type"] == "http.request"
        header_length = next(v for k, v in scope["headers"] if k == b"inference-header-content-length")
        decoded = decode_binary(b"".join(chunks), header_length.decode(), 1 << 28)
        answer = encode_binary({"X": lu_core.solve(decoded.tensors["A"], decoded.tensors["B"])})
        body = b"".join(answer.chunks)
        headers = [
            (b"content-type", b"application/octet-stream"),
            (b"inference-header-content-length", answer.headers["Inference-Header-Content-Length"].encode()),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def main() -> int:
    import uvicorn

    settings = Settings()
    if os.environ.get("LU_BARE_COMPUTE") == "1":
        app = compute_app()
    else:
        app = bare_app(b"\0" * int(os.environ.get("LU_BARE_ANSWER_BYTES", "200")))
    sock = listen(settings.host, settings.port)
    uvicorn.Server(server_config(app, settings)).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
