"""solve_refined, lu_rcond, slogdet and det on CuPy arrays against the CPU path (and cuSOLVER IRS where
nvmath-python is installed). Marked ``gpu``: skipped where CuPy or a CUDA device is missing."""

from __future__ import annotations

import numpy as np
import pytest

import lu_core
from tests.helpers import DTYPES, random_matrix, well_conditioned
from tests.lu_core.test_refine import conditioned

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")


@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_refinement_matches_the_cpu(rng, dtype):
    A = well_conditioned(rng, (5, 2, 24, 24), dtype)
    B = random_matrix(rng, (2, 24, 3), dtype)
    X, it, berr = lu_core.solve_refined(cp.asarray(A), cp.asarray(B))
    assert isinstance(X, cp.ndarray) and isinstance(it, cp.ndarray) and isinstance(berr, cp.ndarray)
    Xc, _, _ = lu_core.solve_refined(A, B)
    eps = np.finfo(np.dtype(dtype)).eps
    np.testing.assert_allclose(cp.asnumpy(X), Xc, atol=100 * 24 * eps)
    assert (cp.asnumpy(it) >= 0).all() and (cp.asnumpy(berr) <= 4 * np.sqrt(24) * eps).all()


def test_fallback_on_the_gpu(rng):
    A = np.stack([conditioned(rng, 48, 1e3), conditioned(rng, 48, 1e13)])
    b = rng.standard_normal((2, 48))
    _, it, _ = lu_core.solve_refined(cp.asarray(A), cp.asarray(b))
    it = cp.asnumpy(it)
    assert it[0] >= 0 and it[1] == -1


@pytest.mark.parametrize("factor_dtype", [None, "tf32", "float16", "bfloat16"])
def test_cusolver_irs_for_one_large_system(rng, factor_dtype):
    pytest.importorskip("nvmath.bindings.cusolverDn")
    n = 2048
    A = rng.standard_normal((n, n)) + np.sqrt(n) * np.eye(n)
    b = rng.standard_normal((n, 1))
    X, it, berr = lu_core.solve_refined(cp.asarray(A), cp.asarray(b), factor_dtype=factor_dtype)
    np.testing.assert_allclose(cp.asnumpy(X), np.linalg.solve(A, b), rtol=1e-10, atol=1e-12)
    assert int(it) >= -1 and float(berr) < 1e-14


def test_gpu_only_factor_types_are_refused_on_the_cpu():
    with pytest.raises(lu_core.FactorDTypeError):
        lu_core.solve_refined(np.eye(2), np.ones(2), factor_dtype="tf32")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", ["1", "inf"])
def test_rcond_matches_the_cpu(rng, dtype, norm):
    A = random_matrix(rng, (6, 9, 9), dtype)
    LU, piv = lu_core.lu_factor(A)
    anorm = np.abs(A).sum(axis=-2 if norm == "1" else -1).max(axis=-1)
    gpu = lu_core.lu_rcond(cp.asarray(LU), cp.asarray(piv), cp.asarray(anorm), norm=norm)
    rtol = 1e-3 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-10
    np.testing.assert_allclose(cp.asnumpy(gpu), lu_core.lu_rcond(LU, piv, anorm, norm=norm), rtol=rtol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_slogdet_and_det_match_the_cpu(rng, dtype):
    A = (random_matrix(rng, (3, 2, 10, 10), dtype) / np.sqrt(10)).astype(dtype)
    A[1, 1] = 0
    sign, logabsdet = lu_core.slogdet(cp.asarray(A))
    want_sign, want_log = lu_core.slogdet(A)
    tol = 1e-4 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-11
    np.testing.assert_allclose(cp.asnumpy(sign), want_sign, atol=tol)
    np.testing.assert_allclose(cp.asnumpy(logabsdet), want_log, atol=tol * 10)
    np.testing.assert_allclose(cp.asnumpy(lu_core.det(cp.asarray(A))), lu_core.det(A), rtol=tol * 10, atol=1e-30)
