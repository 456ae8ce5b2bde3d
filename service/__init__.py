"""The LU service: ``lu_core`` behind HTTP (native JSON/binary routes and the Open Inference Protocol).

Start it with ``python -m service`` (or the ``lu-service`` command); build an
app for tests or another server with :func:`create_app`.
"""

from __future__ import annotations

from service.app import create_app
from service.config import Settings

__all__ = ["Settings", "create_app"]
