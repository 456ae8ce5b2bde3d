"""Where each problem's block of a broadcast operand starts, as element offsets (host side).

The GPU kernels read a broadcast ``B`` through these offsets and its element
strides instead of a materialised copy. Plain NumPy, so the index arithmetic
is tested without a device (tests/lu_core/_gpu/test_broadcast.py).
"""

from __future__ import annotations

import numpy as np


def element_strides(strides: tuple[int, ...], itemsize: int) -> tuple[int, ...] | None:
    """Byte strides as element strides, or None where one is not a whole number of elements."""
    if any(st % itemsize for st in strides):
        return None
    return tuple(st // itemsize for st in strides)


def block_offsets(batch: tuple[int, ...], batch_strides: tuple[int, ...], out_batch: tuple[int, ...]) -> np.ndarray:
    """int64 element offset of the block that problem ``t`` of ``out_batch`` (row-major) reads,
    for an operand of batch shape ``batch`` (broadcastable to ``out_batch``) and element strides
    ``batch_strides``. A broadcast dimension contributes stride 0, so nothing is repeated in memory."""
    off = np.zeros(batch, dtype=np.int64)
    for d, (size, st) in enumerate(zip(batch, batch_strides, strict=True)):
        shape = [1] * len(batch)
        shape[d] = size
        off = off + (np.arange(size, dtype=np.int64) * st).reshape(shape)
    return np.ascontiguousarray(np.broadcast_to(off, out_batch)).reshape(-1)
