"""Triton's request-control options: the keys that ride in ``parameters`` beside an operation's own.

``tritonclient`` puts ``timeout`` and ``priority`` (and, for sequence models,
``sequence_*``) into every inference request's ``parameters``; the HTTP client
can add ``binary_data_output`` and ``headers``. They steer the request, not the
computation, so they are taken out here, once, before
:meth:`service.operations.Operation.prepare` checks the operation's own options
(where an unknown key stays a 422 ``unknown_option``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from service.errors import brief, invalid

__all__ = ["IGNORED", "Control", "earliest", "take_control"]

# Accepted and ignored: the service has no sequence models, chooses binary outputs from
# the request's own framing, and sees HTTP headers as headers.
IGNORED = ("sequence_id", "sequence_start", "sequence_end", "binary_data_output", "headers")


@dataclass(frozen=True)
class Control:
    """How a request is to be handled: its deadline on ``time.monotonic()``'s clock, and its priority."""

    deadline: float | None = None
    priority: int = 0


def _count(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid("invalid_option", f"{key}: expected a non-negative integer, got {brief(value)}")
    return value


def take_control(options: dict[str, Any], now: float | None = None) -> Control:
    """Remove Triton's control keys from ``options`` (in place) and return what they ask for.

    ``timeout`` is in microseconds, as in Triton; 0 means none. ``priority`` is
    accepted (0 is the default; the queue is first come, first served for now).
    """
    flag = options.get("binary_data_output", False)
    if not isinstance(flag, bool):  # (the /v2 decoder has taken its own out, checked the same)
        raise invalid("invalid_option", f"binary_data_output: expected a boolean, got {brief(flag)}")
    for key in IGNORED:
        options.pop(key, None)
    deadline = None
    if "timeout" in options:
        micros = _count("timeout", options.pop("timeout"))
        if micros:
            deadline = (time.monotonic() if now is None else now) + micros / 1e6
    priority = _count("priority", options.pop("priority")) if "priority" in options else 0
    return Control(deadline, priority)


def earliest(*deadlines: float | None) -> float | None:
    """The first of the given deadlines (``None``: no deadline)."""
    given = [d for d in deadlines if d is not None]
    return min(given) if given else None
