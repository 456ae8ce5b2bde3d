"""``lu_core.vjp`` / ``lu_core.jvp`` on CuPy arrays against the same calls on NumPy
arrays (themselves checked against finite differences and PyTorch): results come
back as CuPy arrays, equal within rounding, for every operation and dtype.

Marked ``gpu``: skipped where CuPy or a CUDA device is missing (conftest)."""

from __future__ import annotations

import numpy as np
import pytest

import lu_core
from lu_core import jvp, vjp
from tests.helpers import DTYPES, random_matrix, well_conditioned

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

SHAPES = [(5, 5), (7, 4), (4, 7), (2, 3, 6, 6), (0, 3, 3), (3, 80, 80), (70, 100)]


def rtol(dtype: type) -> float:
    return 1e-3 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-9


def same(gpu, cpu: np.ndarray, dtype: type) -> None:
    assert isinstance(gpu, cp.ndarray), type(gpu)
    g = cp.asnumpy(gpu)
    assert g.shape == cpu.shape and g.dtype == cpu.dtype, (g.shape, cpu.shape, g.dtype, cpu.dtype)
    scale = max(1.0, float(np.max(np.abs(cpu), initial=0.0)))
    assert float(np.max(np.abs(g - cpu), initial=0.0)) <= rtol(dtype) * scale


def factorable(rng, shape, dtype):
    a = random_matrix(rng, shape, dtype)
    m, n = shape[-2:]
    return (a + 2 * np.sqrt(max(m, n, 1)) * np.eye(m, n, dtype=dtype)).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_factor_derivatives(rng, shape, dtype):
    A = factorable(rng, shape, dtype)
    LU, piv = lu_core.lu_factor(A)
    P, L, U = lu_core.lu_unpack(LU, piv)
    g, dA = random_matrix(rng, shape, dtype), random_matrix(rng, shape, dtype)
    gL, gU = random_matrix(rng, L.shape, dtype), random_matrix(rng, U.shape, dtype)
    d = cp.asarray
    m, n = shape[-2:]
    same(vjp.lu_factor(d(LU), d(piv), d(g)), vjp.lu_factor(LU, piv, g), dtype)
    same(jvp.lu_factor(d(dA), d(LU), d(piv)), jvp.lu_factor(dA, LU, piv), dtype)
    same(vjp.lu(d(P), d(L), d(U), d(gL), d(gU)), vjp.lu(P, L, U, gL, gU), dtype)
    same(vjp.lu(d(P), d(L), d(U), None, d(gU)), vjp.lu(P, L, U, None, gU), dtype)
    for gpu, cpu in zip(jvp.lu(d(dA), d(P), d(L), d(U)), jvp.lu(dA, P, L, U), strict=True):
        same(gpu, cpu, dtype)
    same(vjp.lu_unpack(d(gL), d(gU), m, n), vjp.lu_unpack(gL, gU, m, n), dtype)


@pytest.mark.parametrize("adjoint", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("lu_shape", "b_shape"),
    [((5, 5), (5, 2)), ((2, 1, 4, 4), (3, 4, 2)), ((4, 4), (2, 3, 4, 3)), ((2, 70, 70), (70, 70))],
    ids=str,
)
def test_solve_derivatives(rng, lu_shape, b_shape, dtype, left, adjoint):
    A = well_conditioned(rng, lu_shape, dtype)
    B = random_matrix(rng, b_shape if left else (*b_shape[:-2], b_shape[-1], b_shape[-2]), dtype)
    LU, piv = lu_core.lu_factor(A)
    X = lu_core.lu_solve(LU, piv, B, left=left, adjoint=adjoint)
    gX, dLU, dB = (
        random_matrix(rng, X.shape, dtype),
        random_matrix(rng, LU.shape, dtype),
        random_matrix(rng, B.shape, dtype),
    )
    d = cp.asarray
    gpu = vjp.lu_solve(d(LU), d(piv), d(B), d(X), d(gX), left=left, adjoint=adjoint)
    cpu = vjp.lu_solve(LU, piv, B, X, gX, left=left, adjoint=adjoint)
    for g, c in zip(gpu, cpu, strict=True):
        same(g, c, dtype)
    same(
        jvp.lu_solve(d(LU), d(piv), d(X), d(dLU), d(dB), left=left, adjoint=adjoint),
        jvp.lu_solve(LU, piv, X, dLU, dB, left=left, adjoint=adjoint),
        dtype,
    )
    if adjoint:
        return
    Xs = lu_core.solve(A, B, left=left)
    for g, c in zip(vjp.solve(d(A), d(B), d(Xs), d(gX), left=left), vjp.solve(A, B, Xs, gX, left=left), strict=True):
        same(g, c, dtype)
    dA = random_matrix(rng, A.shape, dtype)
    same(jvp.solve(d(A), d(Xs), d(dA), d(dB), left=left), jvp.solve(A, Xs, dA, dB, left=left), dtype)


def test_errors_match_the_cpu():
    LU = np.eye(3)
    with pytest.raises(lu_core.DeviceMismatchError):
        vjp.lu_factor(LU, np.array([1, 2, 3]), cp.ones((3, 3)))
    with pytest.raises(lu_core.PivotError):
        vjp.lu_factor(cp.asarray(LU), cp.asarray([1, 2, 4]), cp.ones((3, 3)))
    with pytest.raises(lu_core.ShapeError):
        jvp.lu_factor(cp.ones((3, 4)), cp.asarray(LU), cp.asarray([1, 2, 3]))
    with pytest.raises(lu_core.SingularMatrixError):
        vjp.solve(cp.zeros((3, 3)), cp.ones(3), cp.ones(3), cp.ones(3))
