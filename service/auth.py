"""Bearer-token authentication, active only when ``LU_API_KEY`` is set."""

from __future__ import annotations

import hmac

from fastapi import Request

from service.errors import ServiceError

__all__ = ["check_authorization", "require_api_key"]


def _matches(token: bytes, keys: tuple[bytes, ...]) -> bool:
    # Compare against every key, without stopping early, in constant time per key.
    found = False
    for key in keys:
        found |= hmac.compare_digest(token, key)
    return found


def check_authorization(authorization: str, keys: tuple[bytes, ...]) -> None:
    """Raise 401 ``unauthorized`` unless ``authorization`` is ``Bearer <one of keys>`` (no keys: open).

    Shared by the HTTP routes (the ``Authorization`` header) and the gRPC door (the
    ``authorization`` metadata entry).
    """
    if not keys:
        return
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token or not _matches(token.strip().encode(), keys):
        raise ServiceError(
            401,
            "unauthorized",
            "missing or wrong API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def require_api_key(request: Request) -> None:
    """FastAPI dependency for every compute and metadata route (health routes stay open)."""
    check_authorization(request.headers.get("authorization", ""), request.app.state.settings.api_keys)
