"""The LU service: ``lu_core`` behind HTTP (native JSON/binary routes and the Open Inference Protocol).

Start it with ``python -m service`` (or the ``lu-service`` command); build an
app for tests or another server with :func:`create_app`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service.app import create_app
    from service.config import Settings

__all__ = ["Settings", "create_app"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `python -m service --help` answers and a busy port is reported
    # before lu_core, Numba and FastAPI are imported (seconds on a cold start).
    if name == "create_app":
        from service.app import create_app

        return create_app
    if name == "Settings":
        from service.config import Settings

        return Settings
    raise AttributeError(f"module 'service' has no attribute {name!r}")
