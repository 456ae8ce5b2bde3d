"""GPU backend against the CPU backend: same results, same errors.

Marked ``gpu``: skipped where CuPy or a CUDA device is missing (conftest)."""

from __future__ import annotations

import numpy as np
import pytest

import lu_core
from tests.helpers import DTYPES, FACTOR_SHAPES, assert_close, random_matrix, well_conditioned

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [*FACTOR_SHAPES, (3000, 8, 8), (1, 300, 300)], ids=str)
def test_factor_and_unpack(rng, shape, dtype):
    A = random_matrix(rng, shape, dtype)
    LU_g, piv_g, info_g = lu_core.lu_factor_ex(cp.asarray(A))
    assert isinstance(LU_g, cp.ndarray)
    m, n = shape[-2:]
    P, L, U = (cp.asnumpy(x) for x in lu_core.lu_unpack(LU_g, piv_g))
    assert_close(P @ L @ U, A, dtype, max(m, n))
    _, piv_c, info_c = lu_core.lu_factor_ex(A)
    np.testing.assert_array_equal(cp.asnumpy(info_g), info_c)
    if np.dtype(dtype) in (np.float64, np.complex128):
        np.testing.assert_array_equal(cp.asnumpy(piv_g), piv_c)


@pytest.mark.parametrize("dtype", DTYPES)
def test_unpack_bit_identical_to_cpu(rng, dtype):
    LU = random_matrix(rng, (4, 7, 5), dtype)
    piv = np.maximum(rng.integers(1, 8, size=(4, 5)), np.arange(1, 6))
    for layout in (LU, np.ascontiguousarray(LU.swapaxes(-1, -2)).swapaxes(-1, -2)):
        cpu = lu_core.lu_unpack(layout, piv)
        gpu = lu_core.lu_unpack(cp.asarray(layout), cp.asarray(piv))
        for c, g in zip(cpu, gpu, strict=True):
            np.testing.assert_array_equal(cp.asnumpy(g), c)


@pytest.mark.parametrize("nrhs", [1, 3, 80])
@pytest.mark.parametrize("adjoint", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("lu_batch", "b_batch", "n"), [((), (), 5), ((2, 1), (3,), 6), ((), (50,), 8), ((2,), (2,), 100)]
)
def test_solve(rng, lu_batch, b_batch, n, dtype, left, adjoint, nrhs):
    A = well_conditioned(rng, (*lu_batch, n, n), dtype)
    B = random_matrix(rng, (*b_batch, n, nrhs) if left else (*b_batch, nrhs, n), dtype)
    LU, piv = lu_core.lu_factor(cp.asarray(A))
    X = cp.asnumpy(lu_core.lu_solve(LU, piv, cp.asarray(B), left=left, adjoint=adjoint))
    X_cpu = lu_core.lu_solve(*lu_core.lu_factor(A), B, left=left, adjoint=adjoint)
    assert_close(X, X_cpu, dtype, n, scale=max(1.0, float(np.abs(X_cpu).max())))


@pytest.mark.parametrize("bad", [0, 9, -1])
def test_bad_pivots_raise_on_the_gpu(bad):
    piv = cp.asarray(np.array([[1, 2, 3], [2, bad, 3]], dtype=np.int64))
    LU = cp.eye(3)[None].repeat(2, axis=0)
    with pytest.raises(lu_core.PivotError, match=r"index \(1, 1\)"):
        lu_core.lu_unpack(LU, piv)
    with pytest.raises(lu_core.PivotError):
        lu_core.lu_solve(LU, piv, cp.ones((2, 3, 1)))
    with pytest.raises(lu_core.PivotError):
        lu_core.pivots_to_permutation(piv, 3)


def test_singular_and_no_pivot(rng):
    A = cp.asarray(np.stack([np.eye(3), np.zeros((3, 3))]))
    _, _, info = lu_core.lu_factor_ex(A)
    assert cp.asnumpy(info).tolist() == [0, 1]
    with pytest.raises(lu_core.SingularMatrixError):
        lu_core.lu_factor(A)
    D = well_conditioned(rng, (4, 6, 6), np.float64) + 20 * np.eye(6)
    _, piv = lu_core.lu_factor(cp.asarray(D), pivot=False)
    np.testing.assert_array_equal(cp.asnumpy(piv), np.broadcast_to(np.arange(1, 7), (4, 6)))
    _, L, U = lu_core.lu(cp.asarray(D), pivot=False)
    np.testing.assert_allclose(cp.asnumpy(L @ U), D, atol=1e-10)


def test_permutation_large_m(rng):
    piv = rng.integers(1, 20001, size=(2, 20000))
    piv = np.maximum(piv, np.arange(1, 20001))
    perm = lu_core.pivots_to_permutation(cp.asarray(piv), 20000)
    np.testing.assert_array_equal(cp.asnumpy(perm), lu_core.pivots_to_permutation(piv, 20000))
