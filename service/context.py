"""The request id of the request being served, for logs and error bodies."""

from __future__ import annotations

from contextvars import ContextVar

__all__ = ["current_request_id", "request_id_var"]

request_id_var: ContextVar[str] = ContextVar("request_id", default="-")


def current_request_id() -> str:
    return request_id_var.get()
