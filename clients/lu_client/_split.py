"""Splitting a batch that is too big for one request, and stitching the answers back in order."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from lu_client._codec import Outputs

__all__ = ["Limits", "Piece", "output_elements", "split"]

Tensors = dict[str, np.ndarray]
MATRIX_DIMS = {"A": 2, "LU": 2, "B": 2, "pivots": 1, "anorm": 0}  # trailing non-batch dims of each input
HEADROOM = 0.9  # of the server's limits, for the JSON header and rounding


@dataclass(frozen=True)
class Limits:
    max_request_bytes: int
    max_elements: int


@dataclass
class Piece:
    tensors: Tensors


def _batch(name: str, arr: np.ndarray) -> tuple[int, ...]:
    return arr.shape[: arr.ndim - MATRIX_DIMS[name]]


def output_elements(op: str, tensors: Mapping[str, np.ndarray]) -> int:
    """What the answer will hold, as the server estimates it before computing."""
    if op in ("lu_factor",):
        a = tensors["A"]
        return a.size + 2 * math.prod(a.shape[:-2]) * min(a.shape[-2:])
    if op in ("lu", "lu_unpack"):
        a = tensors["A" if op == "lu" else "LU"]
        m, n = a.shape[-2:]
        return math.prod(a.shape[:-2]) * (m * m + m * min(m, n) + min(m, n) * n)
    if op in ("lu_rcond", "slogdet", "det"):
        a = tensors["A" if op != "lu_rcond" else "LU"]
        return math.prod(a.shape[:-2]) * (2 if op == "slogdet" else 1)
    lhs = tensors["LU" if op == "lu_solve" else "A"]
    b = tensors["B"]
    problems = math.prod(np.broadcast_shapes(lhs.shape[:-2], b.shape[:-2]))
    extra = 2 * problems if op == "solve_refined" else 0  # iterations, backward_error
    return problems * b.shape[-2] * b.shape[-1] + extra


def split(
    op: str, tensors: Tensors, limits: Limits | None
) -> tuple[list[Piece], Callable[[list[Outputs]], Outputs]] | None:
    """Pieces that each fit the limits and a function that stitches their outputs; None if one request fits.

    Splits along a batch axis: all batch dimensions flattened when the inputs share
    their batch shape, else the longest axis of the broadcast batch (the first of equals;
    inputs that broadcast along it go whole with every piece, as the server would read them).
    """
    if limits is None or any(a.ndim < MATRIX_DIMS[n] for n, a in tensors.items()):
        return None
    try:
        out_elements = output_elements(op, tensors)
    except ValueError:
        return None  # shapes the server will reject anyway
    in_bytes = sum(a.nbytes for a in tensors.values())
    in_elements = sum(a.size for a in tensors.values())
    need = max(
        math.ceil(in_bytes / (HEADROOM * limits.max_request_bytes)),
        math.ceil(in_elements / (HEADROOM * limits.max_elements)),
        math.ceil(out_elements / (HEADROOM * limits.max_elements)),
    )
    if need <= 1:
        return None
    batches = {n: _batch(n, a) for n, a in tensors.items()}
    shapes = set(batches.values())
    if len(shapes) == 1:
        (batch,) = shapes
        if not batch:
            return None  # one matrix: cannot be split
        total = math.prod(batch)
        flat = {n: a.reshape(total, *a.shape[len(batch) :]) for n, a in tensors.items()}
        return _pieces(flat, 0, total, need, lambda x: x.reshape(*batch, *x.shape[1:]))
    rank = max(len(b) for b in batches.values())
    padded = {n: a.reshape((1,) * (rank - len(batches[n])) + a.shape) for n, a in tensors.items()}
    out_batch = np.broadcast_shapes(*(p.shape[:rank] for p in padded.values()))
    axis = max(range(rank), key=lambda i: (out_batch[i], -i)) if rank else None
    if axis is None or out_batch[axis] <= 1:
        return None
    return _pieces(padded, axis, out_batch[axis], need, lambda x: x)


def _pieces(
    tensors: Tensors, axis: int, length: int, need: int, reshape: Callable[[np.ndarray], np.ndarray]
) -> tuple[list[Piece], Callable[[list[Outputs]], Outputs]]:
    step = max(1, math.ceil(length / need))
    pieces = []
    for start in range(0, length, step):
        sl = slice(start, min(start + step, length))
        pieces.append(
            Piece({n: a[(slice(None),) * axis + (sl,)] if a.shape[axis] == length else a for n, a in tensors.items()})
        )

    def stitch(answers: list[Outputs]) -> Outputs:
        merged = Outputs()
        for name, first in answers[0].items():
            if first is None:
                merged[name] = None
            else:
                merged[name] = reshape(np.concatenate([a[name] for a in answers], axis=axis))
        return merged

    return pieces, stitch
