"""Slow, obvious reference implementations: the oracle for every fast path.

Plain Python loops over batch, columns and rows, written to be read, not run
in production. Tests check the CPU kernels, LAPACK paths and the GPU backend
against these. They use the same conventions as the public API (1-based
LAPACK pivots) and do no validation.
"""

from __future__ import annotations

import itertools

import numpy as np


def _magnitude(x: complex) -> float:
    # LAPACK's i?amax: |re| + |im| for complex numbers.
    return abs(x.real) + abs(x.imag)


def lu_factor_ex(A: np.ndarray, pivot: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Right-looking Gaussian elimination, one matrix at a time."""
    A = np.asarray(A)
    *batch, m, n = A.shape
    k = min(m, n)
    LU = np.array(A, copy=True)
    piv = np.zeros((*batch, k), dtype=np.int32)
    info = np.zeros(batch, dtype=np.int32)
    for idx in itertools.product(*(range(d) for d in batch)):
        a = LU[idx]
        for j in range(k):
            p = j
            if pivot:
                for i in range(j + 1, m):
                    if _magnitude(a[i, j]) > _magnitude(a[p, j]):
                        p = i
            piv[(*idx, j)] = p + 1
            if p != j:
                a[[j, p], :] = a[[p, j], :]
            if a[j, j] == 0:
                if info[idx] == 0:
                    info[idx] = j + 1
                continue_scaling = False
            else:
                continue_scaling = True
            for i in range(j + 1, m):
                if continue_scaling:
                    a[i, j] = a[i, j] * (1 / a[j, j])
                for c in range(j + 1, n):
                    a[i, c] = a[i, c] - a[i, j] * a[j, c]
    return LU, piv, info


def pivots_to_permutation(pivots: np.ndarray, m: int) -> np.ndarray:
    pivots = np.asarray(pivots)
    *batch, k = pivots.shape
    perm = np.zeros((*batch, m), dtype=np.int32)
    for idx in itertools.product(*(range(d) for d in batch)):
        order = list(range(m))
        for i in range(k):
            j = int(pivots[(*idx, i)]) - 1
            order[i], order[j] = order[j], order[i]
        perm[idx] = order
    return perm


def lu_unpack(LU: np.ndarray, pivots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    LU = np.asarray(LU)
    *batch, m, n = LU.shape
    k = min(m, n)
    P = np.zeros((*batch, m, m), dtype=LU.dtype)
    L = np.zeros((*batch, m, k), dtype=LU.dtype)
    U = np.zeros((*batch, k, n), dtype=LU.dtype)
    perm = pivots_to_permutation(pivots, m)
    for idx in itertools.product(*(range(d) for d in batch)):
        for j in range(m):
            P[(*idx, int(perm[(*idx, j)]), j)] = 1
        for i in range(m):
            for j in range(k):
                if i > j:
                    L[(*idx, i, j)] = LU[(*idx, i, j)]
                elif i == j:
                    L[(*idx, i, j)] = 1
        for i in range(k):
            for j in range(i, n):
                U[(*idx, i, j)] = LU[(*idx, i, j)]
    return P, L, U


def lu_solve(LU: np.ndarray, pivots: np.ndarray, B: np.ndarray, left: bool = True, adjoint: bool = False) -> np.ndarray:
    """Rebuild ``A = P L U`` for each matrix and solve ``op(A)`` by substitution
    on the explicit matrices: a method independent of the kernels under test."""
    LU, B = np.asarray(LU), np.asarray(B)
    dtype = np.result_type(LU, B)
    P, L, U = lu_unpack(LU, pivots)
    batch = np.broadcast_shapes(LU.shape[:-2], B.shape[:-2])
    Xs = np.zeros((*batch, *B.shape[-2:]), dtype=dtype)
    for idx in itertools.product(*(range(d) for d in batch)):
        li = tuple(i if d != 1 else 0 for i, d in zip(idx[len(idx) - (LU.ndim - 2) :], LU.shape[:-2], strict=True))
        bi = tuple(i if d != 1 else 0 for i, d in zip(idx[len(idx) - (B.ndim - 2) :], B.shape[:-2], strict=True))
        A = P[li] @ L[li] @ U[li]
        opA = A.conj().T if adjoint else A
        b = B[bi]
        if left:
            Xs[idx] = _gauss_solve(opA, b)
        else:  # X opA = b  <=>  opA^T X^T = b^T
            Xs[idx] = _gauss_solve(opA.T, b.T).T
    return Xs


def _gauss_solve(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Textbook Gaussian elimination with partial pivoting on ``[A | b]``."""
    n = A.shape[0]
    M = np.concatenate([A, b], axis=1).astype(np.result_type(A, b))
    for j in range(n):
        p = j + int(np.argmax(np.abs(M[j:, j])))
        M[[j, p]] = M[[p, j]]
        for i in range(j + 1, n):
            M[i] -= M[i, j] / M[j, j] * M[j]
    x = np.zeros_like(M[:, n:])
    for i in range(n - 1, -1, -1):
        x[i] = (M[i, n:] - M[i, i + 1 : n] @ x[i + 1 :]) / M[i, i]
    return x
