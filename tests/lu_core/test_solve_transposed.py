"""``solve`` where the CPU backend factors ``A^T`` (``CpuBackend.solve_by_transpose``: a real ``A`` whose
systems LAPACK's ``getrs`` solves, as ``torch.linalg.solve`` does): correct answers for every shape of call,
the same bits alone and in a batch, and the same singularity verdict in ``solve``, ``vjp.solve`` and
``jvp.solve`` (which factor the same way)."""

from __future__ import annotations

import numpy as np
import pytest

import lu_core
from lu_core._cpu.backend import CPU_BACKEND
from tests.helpers import well_conditioned

# (n, right-hand sides): LAPACK solves every one of these, for both real dtypes; one matrix goes through
# _direct's MKL path (n <= 256), a batch through the pool, n = 300 and 600 through threaded LAPACK.
CASES = [(129, 64), (200, 64), (300, 64), (600, 1)]


def _bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x).tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("n", "nrhs"), CASES)
def test_the_transposed_path_is_taken_and_answers_right(rng, dtype, n, nrhs):
    assert CPU_BACKEND.solve_by_transpose(n, nrhs, np.dtype(dtype))
    A = well_conditioned(rng, (3, n, n), dtype)
    B = rng.standard_normal((3, n, nrhs)).astype(dtype)
    want = np.linalg.solve(A.astype(np.float64), B.astype(np.float64))
    tol = 1e-3 if dtype == np.float32 else 1e-10
    X = lu_core.solve(A, B)
    np.testing.assert_allclose(X, want, rtol=tol, atol=tol)
    # left=False: X A = B with B (k, n).
    Xr = lu_core.solve(A, B.swapaxes(-1, -2), left=False)
    np.testing.assert_allclose(Xr, np.linalg.solve(A.swapaxes(-1, -2), B).swapaxes(-1, -2), rtol=tol, atol=tol)
    # A broadcast (stride 0) over B's batch, an F-ordered A, and a strided one: the same bits as the C-ordered
    # batch, since the path depends on the shapes and dtype alone.
    shared = np.broadcast_to(A[0], (3, n, n))
    assert _bits(lu_core.solve(shared, B)) == _bits(lu_core.solve(np.ascontiguousarray(shared), B))
    fortran = np.ascontiguousarray(A.swapaxes(-1, -2)).swapaxes(-1, -2)
    assert _bits(lu_core.solve(fortran, B)) == _bits(X)
    strided = np.repeat(A, 2, axis=0)[::2]
    assert _bits(lu_core.solve(strided, B)) == _bits(X)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("n", "nrhs"), CASES)
def test_a_system_gets_the_same_bits_alone_and_in_a_batch(rng, dtype, n, nrhs):
    A = well_conditioned(rng, (4, n, n), dtype)
    B = rng.standard_normal((4, n, nrhs)).astype(dtype)
    X = lu_core.solve(A, B)
    for i in (0, 3):
        assert _bits(lu_core.solve(A[i], B[i])) == _bits(X[i])
        assert _bits(lu_core.solve(A[i : i + 1], B[i : i + 1])) == _bits(X[i : i + 1])


def test_mixed_dtypes_solve_in_the_promoted_dtype(rng):
    A = well_conditioned(rng, (2, 200, 200), np.float32)
    B = rng.standard_normal((2, 200, 64))
    X = lu_core.solve(A, B)
    assert X.dtype == np.float64
    np.testing.assert_allclose(X, np.linalg.solve(A.astype(np.float64), B), rtol=1e-4, atol=1e-4)
    Xc = lu_core.solve(A, B.astype(np.complex64))
    assert Xc.dtype == np.complex64
    np.testing.assert_allclose(Xc, np.linalg.solve(A.astype(np.float64), B), rtol=1e-3, atol=1e-3)


def _verdict(fn) -> bool:
    try:
        fn()
    except lu_core.SingularMatrixError:
        return True
    return False


@pytest.mark.parametrize("nrhs", [1, 64])
@pytest.mark.parametrize("kind", ["equal rows", "equal columns", "zero row", "zero column"])
def test_solve_and_its_derivatives_agree_on_singular_matrices(kind, nrhs):
    """Whether elimination meets an exact zero depends on which factorization runs: with the rows (3, 5)
    twice, MKL's getrf of A meets an exact zero, of A^T not (5 - fl(5 * fl(1/3)) * 3 is not 0).
    solve, vjp.solve and jvp.solve factor the same way, so they agree; zero rows and columns are singular
    either way. With 64 right-hand sides solve factors A^T (as torch.linalg.solve does), with one A."""
    n = 200
    A = 10.0 * np.eye(n)
    A[:2, :2] = [[3.0, 5.0], [3.0, 5.0]]  # equal rows
    if kind == "equal columns":
        A = np.ascontiguousarray(A.T)
    elif kind == "zero row":
        A = 10.0 * np.eye(n)
        A[5] = 0
    elif kind == "zero column":
        A = 10.0 * np.eye(n)
        A[:, 5] = 0
    B = np.ones((n, nrhs))
    forward = _verdict(lambda: lu_core.solve(A, B))
    X = lu_core.solve(A, B, check_errors=False)
    assert _verdict(lambda: lu_core.vjp.solve(A, B, X, np.ones_like(X))) == forward
    assert _verdict(lambda: lu_core.jvp.solve(A, X, np.eye(n), None)) == forward
    transposed = CPU_BACKEND.solve_by_transpose(n, nrhs, np.dtype(np.float64))
    assert transposed == (nrhs == 64)
    # The verdict is that of the factorization that runs.
    assert forward == _verdict(lambda: lu_core.lu_factor(np.ascontiguousarray(A.T) if transposed else A))
    if kind.startswith("zero"):
        assert forward


@pytest.mark.parametrize("n", [129, 300])
def test_derivatives_of_a_transposed_solve_match_the_plain_formulas(rng, n):
    """vjp.solve and jvp.solve on the A^T factorization: grad_B = A^-T g, grad_A = -grad_B X^T, dX = A^-1 (dB - dA X)."""
    A = well_conditioned(rng, (n, n), np.float64)
    B = rng.standard_normal((n, 64))
    X = lu_core.solve(A, B)
    g = rng.standard_normal(X.shape)
    gA, gB = lu_core.vjp.solve(A, B, X, g)
    np.testing.assert_allclose(gB, np.linalg.solve(A.T, g), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(gA, -gB @ X.T, rtol=1e-9, atol=1e-9)
    dA, dB = rng.standard_normal((n, n)), rng.standard_normal((n, 64))
    dX = lu_core.jvp.solve(A, X, dA, dB)
    np.testing.assert_allclose(dX, np.linalg.solve(A, dB - dA @ X), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_on_the_transposed_path_answers_without_a_crash(rng, bad):
    """NaN or infinite entries in A or B (n = 200, 64 right-hand sides: A^T is factored): no exception
    beyond the documented ones, non-finite answers where B or A held a NaN, and the same bits alone as in a
    batch (NaNs compared as NaNs)."""
    A = well_conditioned(rng, (3, 200, 200), np.float64)
    B = rng.standard_normal((3, 200, 64))
    A[1, 10, 20] = bad
    B[2, 5, 3] = bad
    X = lu_core.solve(A, B, check_errors=False)
    assert np.isfinite(X[0]).all()
    assert not np.isfinite(X[2]).all()
    if np.isnan(bad):  # (an infinite entry of A may be divided away: X can stay finite)
        assert not np.isfinite(X[1]).all()
    for i in range(3):
        np.testing.assert_array_equal(lu_core.solve(A[i], B[i], check_errors=False), X[i])
