"""Where each problem's block of a broadcast operand starts, as element offsets (host side).

The GPU kernels read a broadcast ``B`` through these offsets and its element
strides instead of a materialised copy. Small batches get the offsets computed
here (:func:`block_offsets`, kept on the device by ``_constants``); large ones
get them computed on the device (``kernels.cu``'s ``batch_offsets``) from
:func:`offset_terms`, without a host array of one entry per problem (at 100000
problems ``block_offsets`` alone took ~1 ms of host time, beside its copy up).
Plain NumPy, so the index arithmetic is tested without a device
(tests/lu_core/_gpu/test_host_logic.py).
"""

from __future__ import annotations

import math

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


#: Terms ``batch_offsets`` takes; operands whose offsets need more are computed on the host.
MAX_TERMS = 4


def offset_terms(
    batch: tuple[int, ...], batch_strides: tuple[int, ...], out_batch: tuple[int, ...]
) -> tuple[tuple[int, int, int], ...]:
    """:func:`block_offsets` as ``(inner, size, stride)`` terms: the offset of problem ``t`` is the sum
    of ``(t // inner) % size * stride``. A broadcast dimension (or one of size 1) adds nothing and is
    left out; neighbours that step through memory as one dimension are merged, so a contiguous or
    evenly strided operand takes one term, whatever its number of batch dimensions."""
    if 0 in out_batch:
        return ()  # no problems: nothing to offset (and no term may divide by an inner of 0)
    lead = len(out_batch) - len(batch)
    terms: list[tuple[int, int, int]] = []
    inner = 1
    for d in range(len(out_batch) - 1, lead - 1, -1):  # innermost first
        size, st = out_batch[d], batch_strides[d - lead]
        if size > 1 and batch[d - lead] == size and st != 0:
            if terms and terms[-1][0] * terms[-1][1] == inner and terms[-1][2] * terms[-1][1] == st:
                i, s, stride = terms[-1]
                terms[-1] = (i, s * size, stride)  # one step of this dimension = size of the previous
            else:
                terms.append((inner, size, st))
        inner *= size
    return tuple(terms)


def index_terms(batch: tuple[int, ...], out_batch: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    """``broadcast_index(batch, out_batch)`` (which matrix of a ``batch`` each problem uses) as
    :func:`offset_terms`: the offsets of a contiguous batch counted in matrices."""
    matrices = tuple(math.prod(batch[d + 1 :]) for d in range(len(batch)))  # row-major strides
    return offset_terms(batch, matrices, out_batch)


def uniform_step(terms: tuple[tuple[int, int, int], ...], nprob: int) -> int | None:
    """The step ``s`` with offset ``t * s`` for problem ``t``, where :func:`offset_terms`' (or
    :func:`index_terms`') ``terms`` reduce to one: 0 when every problem reads the same block (no
    term), the stride of a single term that steps once per problem; None otherwise (an offset per
    problem needs an array)."""
    if not terms:
        return 0
    if len(terms) == 1 and terms[0][0] == 1 and terms[0][1] == nprob:
        return terms[0][2]
    return None


def diagonal_steps(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int] | None:
    """``(step, s_diag)``, element strides with which entry ``i`` of matrix ``b``'s diagonal is at
    ``b * step + i * s_diag`` (``b`` over the flattened batch of a ``(*batch, m, n)`` array of byte
    ``strides``, from its first element), or None where the batch does not step evenly through memory
    (or a stride is no whole number of elements)."""
    el = element_strides(strides, itemsize)
    if el is None:
        return None
    batch = tuple(shape[:-2])
    step = uniform_step(offset_terms(batch, el[:-2], batch), math.prod(batch))
    return None if step is None else (step, el[-2] + el[-1])
