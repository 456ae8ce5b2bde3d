from __future__ import annotations

import numpy as np
import pytest

import lu_core
from lu_core import _reference
from tests.helpers import DTYPES, assert_close, cpu_path, random_matrix, well_conditioned

# (LU batch, B batch, n, nrhs)
CASES = [
    ((), (), 1, 1),
    ((), (), 5, 3),
    ((), (), 0, 2),
    ((), (), 4, 0),
    ((3,), (3,), 4, 2),
    ((2, 1), (3,), 3, 2),  # broadcast both ways -> (2, 3)
    ((), (4,), 6, 1),  # one LU for many right-hand sides
    ((4,), (), 6, 1),
    ((0,), (1,), 3, 1),
    ((2,), (2,), 70, 5),
]


def _op(A, left, adjoint):
    return A.conj().swapaxes(-1, -2) if adjoint else A


@pytest.mark.parametrize("path", ["kernel", "lapack"])
@pytest.mark.parametrize("adjoint", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_residual(rng, case, dtype, left, adjoint, path):
    lu_batch, b_batch, n, nrhs = case
    A = well_conditioned(rng, (*lu_batch, n, n), dtype)
    B = random_matrix(rng, (*b_batch, n, nrhs) if left else (*b_batch, nrhs, n), dtype)
    with cpu_path(path):
        LU, piv = lu_core.lu_factor(A)
        X = lu_core.lu_solve(LU, piv, B, left=left, adjoint=adjoint)
    out_batch = np.broadcast_shapes(lu_batch, b_batch)
    assert X.shape == (*out_batch, *B.shape[-2:]) and X.dtype == np.dtype(dtype)
    opA = _op(A, left, adjoint)
    AX = opA @ X if left else X @ opA
    assert_close(AX, np.broadcast_to(B, AX.shape), dtype, n, scale=max(1.0, float(np.abs(B).max(initial=0))))


def _laid_out(B: np.ndarray, layout: str) -> np.ndarray:
    if layout == "F":
        return np.ascontiguousarray(B.swapaxes(-1, -2)).swapaxes(-1, -2)  # column-major per matrix
    if layout == "strided":
        big = np.zeros((*B.shape[:-2], 2 * B.shape[-2], 3 * B.shape[-1]), B.dtype)
        big[..., ::2, ::3] = B
        return big[..., ::2, ::3]
    return B


@pytest.mark.parametrize("path", ["kernel", "lapack"])
@pytest.mark.parametrize("layout", ["F", "strided"])
@pytest.mark.parametrize("adjoint", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_every_rhs_layout_gives_the_bits_of_a_c_ordered_one(rng, dtype, left, adjoint, layout, path):
    """Each path copies B into its work array its own way (LAPACK's pool threads transpose a
    C-ordered block just before solving it; a conjugated right-side solve must not take that road)."""
    A = well_conditioned(rng, (3, 20, 20), dtype)
    B = random_matrix(rng, (3, 20, 4) if left else (3, 4, 20), dtype)
    with cpu_path(path):
        LU, piv = lu_core.lu_factor(A)
        X = lu_core.lu_solve(LU, piv, _laid_out(B, layout), left=left, adjoint=adjoint)
        X_c = lu_core.lu_solve(LU, piv, np.ascontiguousarray(B), left=left, adjoint=adjoint)
    np.testing.assert_array_equal(X, X_c)
    assert_close(X, _reference.lu_solve(LU, piv, B, left=left, adjoint=adjoint), dtype, 20)


@pytest.mark.parametrize("layout", ["C", "F"])
def test_many_rhs_above_the_pool_size(rng, layout):
    """Above LAPACK_POOL_MAX_N the right-hand sides are copied into LAPACK's layout up front (one
    parallel copy), not by the solving threads: residuals, and the bits of the other layout."""
    n = 260
    A = well_conditioned(rng, (2, n, n), np.float64)
    B = random_matrix(rng, (2, n, 3), np.float64)
    LU, piv = lu_core.lu_factor(A)
    X = lu_core.lu_solve(LU, piv, _laid_out(B, layout))
    np.testing.assert_array_equal(X, lu_core.lu_solve(LU, piv, np.ascontiguousarray(B)))
    assert_close(A @ X, B, np.float64, n, scale=max(1.0, float(np.abs(B).max())))


@pytest.mark.parametrize("adjoint", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_matches_reference(rng, dtype, left, adjoint):
    A = well_conditioned(rng, (2, 1, 5, 5), dtype)
    B = random_matrix(rng, (3, 5, 2) if left else (3, 2, 5), dtype)
    LU, piv = lu_core.lu_factor(A)
    X = lu_core.lu_solve(LU, piv, B, left=left, adjoint=adjoint)
    X_ref = _reference.lu_solve(LU, piv, B, left=left, adjoint=adjoint)
    assert_close(X, X_ref, dtype, 5)


def test_complex_adjoint_is_conjugate_transpose(rng):
    A = well_conditioned(rng, (4, 4), np.complex128)
    B = random_matrix(rng, (4, 2), np.complex128)
    LU, piv = lu_core.lu_factor(A)
    X = lu_core.lu_solve(LU, piv, B, adjoint=True)
    np.testing.assert_allclose(A.conj().T @ X, B, atol=1e-12)
    assert not np.allclose(A.T @ X, B)


def test_factor_from_c_ordered_lu(rng):
    # An LU that arrives C-ordered (e.g. decoded from JSON) solves the same.
    A = well_conditioned(rng, (3, 80, 80), np.float64)
    B = rng.standard_normal((3, 80, 2))
    LU, piv = lu_core.lu_factor(A)
    X_f = lu_core.lu_solve(LU, piv, B)
    X_c = lu_core.lu_solve(np.ascontiguousarray(LU), piv.astype(np.int64), B)
    np.testing.assert_allclose(X_f, X_c, rtol=1e-13)


def test_inputs_not_modified(rng):
    A = well_conditioned(rng, (2, 6, 6), np.float64)
    B = rng.standard_normal((6, 1))  # a view-prone shape: (6, 1) transposed is contiguous
    LU, piv = lu_core.lu_factor(A)
    saved = LU.copy(), piv.copy(), B.copy()
    lu_core.lu_solve(LU, piv, B)
    lu_core.lu_solve(LU, piv, B.T, left=False)
    for after, before in zip((LU, piv, B), saved, strict=True):
        np.testing.assert_array_equal(after, before)


def test_dtype_promotion(rng):
    A = well_conditioned(rng, (3, 3), np.float32)
    LU, piv = lu_core.lu_factor(A)
    X = lu_core.lu_solve(LU, piv, np.ones((3, 1)))
    assert X.dtype == np.float64
    Xc = lu_core.lu_solve(LU, piv, np.ones((3, 1), np.complex64))
    assert Xc.dtype == np.complex64


def test_singular_lu_gives_non_finite_not_error():
    LU, piv, _ = lu_core.lu_factor_ex(np.zeros((2, 2)))
    with np.errstate(all="ignore"):
        X = lu_core.lu_solve(LU, piv, np.ones((2, 1)))
    assert not np.isfinite(X).all()


class TestSolve:
    @pytest.mark.parametrize("dtype", DTYPES)
    def test_matrix_and_vector(self, rng, dtype):
        A = well_conditioned(rng, (3, 4, 4), dtype)
        B = random_matrix(rng, (3, 4, 2), dtype)
        X = lu_core.solve(A, B)
        assert_close(A @ X, B, dtype, 4, scale=float(np.abs(B).max()))
        b = random_matrix(rng, (3, 4), dtype)  # B.shape == A.shape[:-1]: batch of vectors
        x = lu_core.solve(A, b)
        assert x.shape == (3, 4)
        assert_close(np.einsum("bij,bj->bi", A, x), b, dtype, 4, scale=float(np.abs(b).max()))
        v = random_matrix(rng, (4,), dtype)  # 1-D: one vector for every matrix
        assert lu_core.solve(A, v).shape == (3, 4)

    def test_right_side(self, rng):
        A = well_conditioned(rng, (2, 5, 5), np.float64)
        B = rng.standard_normal((2, 3, 5))
        X = lu_core.solve(A, B, left=False)
        np.testing.assert_allclose(X @ A, B, atol=1e-12)
        v = rng.standard_normal(5)
        x = lu_core.solve(A, v[None], left=False)  # a row vector is a (1, n) matrix with left=False
        np.testing.assert_allclose(x @ A, np.broadcast_to(v[None], (2, 1, 5)), atol=1e-12)

    @pytest.mark.parametrize(
        ("a_shape", "b_shape"), [((5, 5), (5,)), ((1, 1), (1,)), ((3, 3, 3), (3, 3)), ((2, 4, 4), (4,))]
    )
    def test_vectors_are_refused_with_left_false_as_torch_refuses_them(self, rng, a_shape, b_shape):
        """torch.linalg.solve takes a batch of vectors (1-D B, or B.shape == A.shape[:-1]) with left=True only;
        a (3, 3) B beside a (3, 3, 3) A was read here as 3 row vectors where a user may mean one matrix."""
        A, B = well_conditioned(rng, a_shape, np.float64), rng.standard_normal(b_shape)
        for call in (lu_core.solve, lambda A, B, left: lu_core.solve_refined(A, B, left=left)):
            with pytest.raises(lu_core.ShapeError, match=r"^B: of shape .* batch of vectors .* left=False") as info:
                call(A, B, left=False)
            assert isinstance(info.value, ValueError)
        X = lu_core.solve(A, B)  # left=True: vectors in, vectors out
        assert X.shape == np.broadcast_shapes(a_shape[:-1], b_shape)

    def test_broadcast_factors_each_a_once(self, rng):
        A = well_conditioned(rng, (5, 5), np.float64)
        B = rng.standard_normal((7, 2, 5, 1))
        X = lu_core.solve(A, B)
        assert X.shape == (7, 2, 5, 1)
        np.testing.assert_allclose(A @ X, B, atol=1e-12)

    def test_lu_solve_check_errors_names_singular_factorizations(self, rng):
        A = well_conditioned(rng, (2, 3, 4, 4), np.float64)
        A[1, 2, :, 2] = 0  # U[2, 2] is then exactly zero
        LU, piv, info = lu_core.lu_factor_ex(A)
        B = rng.standard_normal((2, 3, 4, 1))
        with pytest.raises(lu_core.SingularMatrixError) as excinfo:
            lu_core.lu_solve(LU, piv, B, check_errors=True)
        assert excinfo.value.indices == [(1, 2)]
        assert excinfo.value.info == [int(info[1, 2])] == [3]
        with np.errstate(all="ignore"):
            lu_core.lu_solve(LU, piv, B)  # the default does not check, as in PyTorch
        good = lu_core.lu_solve(LU[0], piv[0], B[0], check_errors=True)
        np.testing.assert_allclose(A[0] @ good, B[0], atol=1e-12)
        empty = lu_core.lu_solve(
            np.zeros((2, 0, 0)), np.zeros((2, 0), np.int32), np.zeros((2, 0, 1)), check_errors=True
        )
        assert empty.shape == (2, 0, 1)

    def test_singular_raises_naming_batch_index(self, rng):
        A = well_conditioned(rng, (3, 3, 3), np.float64)
        A[1] = 0
        with pytest.raises(lu_core.SingularMatrixError) as excinfo:
            lu_core.solve(A, np.ones((3, 3, 1)))
        assert excinfo.value.indices == [(1,)]
        with np.errstate(all="ignore"):
            X = lu_core.solve(A, np.ones((3, 3, 1)), check_errors=False)
        assert np.isfinite(X[0]).all() and not np.isfinite(X[1]).all()


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128, np.float32, np.float64])
@pytest.mark.parametrize("n", [2, 24])
def test_singular_factorization_solves_to_nonfinite_without_raising(dtype, n):
    """An exact zero on U's diagonal gives infinities or NaNs, as LAPACK and PyTorch (check_errors=False)
    do; Numba's complex division by zero would raise ZeroDivisionError, which must not escape."""
    A = np.eye(n, dtype=dtype)
    A[-1, -1] = 0
    LU, piv, info = lu_core.lu_factor_ex(A)
    assert int(info) == n
    rhs = np.ones((n, 2), dtype)
    for X in (
        lu_core.lu_solve(LU, piv, rhs),
        lu_core.lu_solve(LU, piv, rhs[:, :1]),
        lu_core.lu_solve(LU, piv, rhs, adjoint=True),
        lu_core.lu_solve(LU, piv, rhs.T, left=False),
        lu_core.solve(A, rhs, check_errors=False),
        lu_core.solve(A, rhs[:, 0], check_errors=False),
    ):
        assert not np.isfinite(X).all()


def test_which_real_systems_the_solve_kernel_takes(lapack, monkeypatch):
    """The kernel/LAPACK split of real solves (``_tuning``), by size, dtype and the process's LAPACK, never
    the batch. Against MKL: float32 to n = 128, float64 to 96, under one work bound. Against OpenBLAS: both
    to 96 under smaller bounds (64 x 128; 32 x 1024 up to n = 32), inside MKL's, so that a choice inside both
    is made without choosing a LAPACK. Complex: the small limits only."""
    from lu_core._cpu import _lapack, _tuning
    from lu_core._cpu.backend import _solve_by_kernel

    f32, f64, c64 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.complex64)
    c128 = np.dtype(np.complex128)
    assert not _solve_by_kernel(64, 64, c64) and not _solve_by_kernel(64, 64, c128)  # complex: the small limits only
    work = _tuning.SOLVE_KERNEL_REAL_MAX_WORK
    for dt in (f32, f64):
        assert _solve_by_kernel(512, 1, dt) and not _solve_by_kernel(513, 1, dt)  # n * nrhs <= 768 to n = 512
        assert not _solve_by_kernel(32, work // 32 + 1, dt)
    if lapack == "mkl":
        assert _tuning.SOLVE_KERNEL_FLOAT32_MAX_N == 128 and _tuning.SOLVE_KERNEL_REAL_MAX_N == 96
        assert _solve_by_kernel(128, 64, f32) and not _solve_by_kernel(129, 64, f32)
        assert _solve_by_kernel(96, 64, f64) and not _solve_by_kernel(97, 64, f64)
        assert not _solve_by_kernel(128, 64, f64)
        assert _solve_by_kernel(128, work // 128, f32) and not _solve_by_kernel(128, work // 128 + 1, f32)
        assert _solve_by_kernel(32, work // 32, f64) and _solve_by_kernel(96, 1024, f64)
    else:
        assert _tuning.SOLVE_KERNEL_OPENBLAS_MAX_N == 96 and _tuning.SOLVE_KERNEL_OPENBLAS_MAX_WORK == 8 * 1024
        assert _tuning.SOLVE_KERNEL_OPENBLAS_SMALL_N == 32 and _tuning.SOLVE_KERNEL_OPENBLAS_SMALL_WORK == 32 * 1024
        for dt in (f32, f64):
            assert _solve_by_kernel(96, 64, dt) and not _solve_by_kernel(96, 128, dt)
            assert _solve_by_kernel(64, 128, dt) and not _solve_by_kernel(64, 129, dt)
            assert _solve_by_kernel(33, 8192 // 33, dt) and not _solve_by_kernel(33, 8192 // 33 + 1, dt)
            assert _solve_by_kernel(32, 1024, dt) and not _solve_by_kernel(32, 1025, dt)
            assert not _solve_by_kernel(128, 64, dt) and not _solve_by_kernel(97, 8, dt)
    # OpenBLAS's limits lie inside MKL's: a choice inside both never asks which LAPACK there is.
    mkl_max_n = min(_tuning.SOLVE_KERNEL_REAL_MAX_N, _tuning.SOLVE_KERNEL_FLOAT32_MAX_N)
    assert mkl_max_n >= _tuning.SOLVE_KERNEL_OPENBLAS_MAX_N
    assert max(_tuning.SOLVE_KERNEL_OPENBLAS_MAX_WORK, _tuning.SOLVE_KERNEL_OPENBLAS_SMALL_WORK) <= work

    def refused() -> None:
        raise AssertionError("the LAPACK was asked for a choice inside both LAPACKs' limits")

    monkeypatch.setattr(_lapack, "lapack", refused)
    for dt in (f32, f64):
        for n, nrhs in ((32, 1024), (64, 128), (96, 64), (16, 10**6), (512, 1)):
            assert _solve_by_kernel(n, nrhs, dt)
        assert not _solve_by_kernel(129, 8, dt) and not _solve_by_kernel(32, work // 32 + 1, dt)


@pytest.mark.parametrize("left", [True, False])
def test_float32_at_the_kernels_mkl_limit_matches_lapack_and_is_batch_invariant(rng, left, lapack):
    """n = 128 float32 with 64 right-hand sides runs the kernel beside MKL and getrs beside OpenBLAS: the
    same solution as the other path's (to float32 rounding), the bits of the path chosen, and, alone or in
    a batch, the same bits."""
    from lu_core._cpu.backend import _solve_by_kernel

    n = 128
    A = well_conditioned(rng, (3, n, n), np.float32)
    B = rng.standard_normal((3, n, 64) if left else (3, 64, n)).astype(np.float32)
    LU, piv = lu_core.lu_factor(A)
    X = lu_core.lu_solve(LU, piv, B, left=left)
    chosen, other = ("kernel", "lapack") if _solve_by_kernel(n, 64, np.dtype(np.float32)) else ("lapack", "kernel")
    assert chosen == ("kernel" if lapack == "mkl" else "lapack")
    with cpu_path(other):
        assert_close(X, lu_core.lu_solve(LU, piv, B, left=left), np.float32, n)
    with cpu_path(chosen):
        assert np.array_equal(X, lu_core.lu_solve(LU, piv, B, left=left))  # it was the chosen path's answer
    alone = [lu_core.lu_solve(LU[i], piv[i], B[i], left=left) for i in range(3)]
    assert all(np.array_equal(X[i], alone[i]) for i in range(3))


@pytest.fixture(scope="module")
def branchy_getrs():
    """The solve kernel's loop as it was before its skip became a select: a branch per entry (LAPACK's
    ``?trsm`` rule, an update by a zero entry skipped), compiled by Numba as the kernel is, so that the
    two are compared in the same arithmetic (division included)."""
    import numba as nb

    from lu_core._cpu import _kernels

    @nb.njit(nogil=True, error_model="numpy")
    def getrs(a, p, x):
        n, nrhs = x.shape
        for i in range(n):
            q = p[i]
            if q != i:
                for r in range(nrhs):
                    t = x[i, r]
                    x[i, r] = x[q, r]
                    x[q, r] = t
        for j in range(n):
            for i in range(j + 1, n):
                for r in range(nrhs):
                    if x[j, r] != 0:
                        x[i, r] -= a[j, i] * x[j, r]
        for j in range(n - 1, -1, -1):
            for r in range(nrhs):
                x[j, r] = _kernels._div(x[j, r], a[j, j])
            for i in range(j):
                for r in range(nrhs):
                    if x[j, r] != 0:
                        x[i, r] -= a[j, i] * x[j, r]

    return getrs


@pytest.mark.parametrize("infinite", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [6, 40, 90])
def test_solve_kernel_skips_updates_by_zeros_bit_for_bit(rng, branchy_getrs, dtype, n, infinite):
    """The solve kernel's loop over several right-hand sides keeps an entry where LAPACK skips its update
    (a select, not a branch, so it vectorizes under AVX2): the branch's bits on sparse right-hand sides
    (zeros, signed zeros, identity columns, finite values), with and without infinite entries of L and U,
    which then meet zeros only in the all-zero columns (no ``0 * inf``: X stays zero there)."""
    from lu_core._cpu.backend import _solve_by_kernel

    nrhs = 8
    assert _solve_by_kernel(n, nrhs, np.dtype(dtype))  # the kernel's path, not LAPACK's
    LU, piv = lu_core.lu_factor(well_conditioned(rng, (n, n), dtype))
    LU = LU.copy()
    if infinite:
        LU[4, 2] = np.inf  # an entry of L, multiplying X[2]
        LU[1, 3] = -np.inf  # an entry of U, multiplying X[3]
    B = random_matrix(rng, (n, nrhs), dtype)
    B[rng.random((n, nrhs)) < 0.5] = 0
    B[rng.random((n, nrhs)) < 0.1] = -0.0
    B[:, 0] = 0
    B[:, 1] = -0.0
    B[:, 2:4] = np.eye(n, 2, k=-n // 2)  # two identity columns, from the middle on
    with np.errstate(all="ignore"):
        X = lu_core.lu_solve(LU, piv, B)
        ref = B.copy()
        branchy_getrs(np.ascontiguousarray(LU.T), (piv - 1).astype(np.int32), ref)
    assert X.tobytes() == ref.tobytes()
    assert not np.any(X[:, :2]) and np.isfinite(X[:, :2]).all()  # zeros in, zeros out, whatever L and U hold
    if not infinite:
        assert np.isfinite(X).all() and np.count_nonzero(X[:, 2:]) > n  # finite values went through
