"""Batch bookkeeping shared by the backends: broadcasting without copies."""

from __future__ import annotations

import math

import numpy as np


def broadcast_index(batch: tuple[int, ...], out_batch: tuple[int, ...]) -> np.ndarray:
    """For each problem of ``out_batch`` (row-major), the flat index of the
    matrix of ``batch`` that broadcasts to it. Broadcast operands are then read
    through this index (or repeated pointers) instead of being copied."""
    if batch == out_batch:  # the common case, without the broadcasting machinery (~5 us)
        return np.arange(math.prod(batch), dtype=np.intp)
    flat = np.arange(math.prod(batch), dtype=np.intp).reshape(batch)
    return np.ascontiguousarray(np.broadcast_to(flat, out_batch)).reshape(-1)


def unravel(flat: np.ndarray, batch: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Flat batch indices as index tuples (``()`` for an unbatched input)."""
    if not batch:
        return [() for _ in flat]
    return [tuple(int(v) for v in idx) for idx in zip(*np.unravel_index(flat, batch), strict=True)]
