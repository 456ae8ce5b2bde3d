"""The request id of the request being served, for logs and error bodies."""

from __future__ import annotations

import os
import random
import re
from contextvars import ContextVar

__all__ = ["choose_request_id", "current_request_id", "new_request_id", "request_id_var"]

_VALID_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")

request_id_var: ContextVar[str] = ContextVar("request_id", default="-")

# The ids' own generator: seeded from the OS, again in a forked child, and by nobody else
# (random.seed() elsewhere in the process does not make ids repeat).
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)
getrandbits = _ids.getrandbits


def current_request_id() -> str:
    return request_id_var.get()


def new_request_id() -> str:
    """A fresh request id: 128 random bits in 32 hex digits (as ``uuid4().hex``, without building a UUID).

    From a generator of this module's (Mersenne Twister, seeded by the OS at start and again in a
    forked child), not ``os.urandom``: an id correlates logs and answers and guards nothing (it is
    predictable from enough earlier ids), and the system call per request showed in the profile of
    small requests.
    """
    return f"{getrandbits(128):032x}"


def choose_request_id(given: str | None) -> str:
    """The client's id when it is well-formed (``X-Request-ID``, or gRPC ``x-request-id``), else a fresh one."""
    return given if given and _VALID_ID.fullmatch(given) else new_request_id()
