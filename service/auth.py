"""Bearer-token authentication, active only when ``LU_API_KEY`` is set."""

from __future__ import annotations

import hmac

from fastapi import Request

from service.errors import ServiceError

__all__ = ["require_api_key"]


def _matches(token: bytes, keys: tuple[bytes, ...]) -> bool:
    # Compare against every key, without stopping early, in constant time per key.
    found = False
    for key in keys:
        found |= hmac.compare_digest(token, key)
    return found


async def require_api_key(request: Request) -> None:
    """FastAPI dependency for every compute and metadata route (health routes stay open)."""
    keys: tuple[bytes, ...] = request.app.state.settings.api_keys
    if not keys:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token or not _matches(token.strip().encode(), keys):
        raise ServiceError(
            401,
            "unauthorized",
            "missing or wrong API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
