from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

import lu_core
from lu_core import _reference
from tests.helpers import DTYPES, FACTOR_SHAPES, assert_close, cpu_path, random_matrix


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", FACTOR_SHAPES, ids=str)
def test_reconstruction(rng, shape, dtype):
    A = random_matrix(rng, shape, dtype)
    LU, piv, info = lu_core.lu_factor_ex(A)
    m, n = shape[-2:]
    k = min(m, n)
    assert LU.shape == A.shape and LU.dtype == np.dtype(dtype)
    assert piv.shape == (*shape[:-2], k) and piv.dtype == np.int32
    assert info.shape == shape[:-2] and info.dtype == np.int32
    assert not info.any()
    if piv.size:
        assert piv.min() >= 1 and piv.max() <= m
    P, L, U = lu_core.lu_unpack(LU, piv)
    assert_close(P @ L @ U, A, dtype, max(m, n))
    P2, L2, U2 = lu_core.lu(A)
    np.testing.assert_array_equal(P2, P)
    np.testing.assert_array_equal(L2, L)
    np.testing.assert_array_equal(U2, U)


@pytest.mark.parametrize("path", ["kernel", "lapack"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (5, 5), (3, 6, 4), (2, 4, 7), (2, 2, 9, 9)], ids=str)
def test_matches_reference(rng, shape, dtype, path):
    A = random_matrix(rng, shape, dtype)
    with cpu_path(path):
        LU, piv, info = lu_core.lu_factor_ex(A)
    LU_ref, piv_ref, info_ref = _reference.lu_factor_ex(A)
    np.testing.assert_array_equal(piv, piv_ref)
    np.testing.assert_array_equal(info, info_ref)
    assert_close(LU, LU_ref, dtype, max(shape[-2:]))


@pytest.mark.parametrize("path", ["kernel", "lapack"])
@pytest.mark.parametrize("shape", [(8, 8), (33, 33), (64, 64), (50, 20), (20, 50)], ids=str)
def test_pivots_equal_lapack(rng, shape, path):
    # SciPy's lu_factor is LAPACK ?getrf; its pivots are 0-based.
    A = rng.standard_normal(shape)
    with cpu_path(path):
        LU, piv = lu_core.lu_factor(A)
    LU_ref, piv_ref = scipy.linalg.lu_factor(A)
    np.testing.assert_array_equal(piv, piv_ref + 1)
    np.testing.assert_allclose(LU, LU_ref, rtol=1e-10, atol=1e-12)


def test_both_paths_agree_on_a_batch(rng):
    A = random_matrix(rng, (40, 24, 24), np.complex128)
    with cpu_path("kernel"):
        LU_k, piv_k, _ = lu_core.lu_factor_ex(A)
    with cpu_path("lapack"):
        LU_l, piv_l, _ = lu_core.lu_factor_ex(A)
    np.testing.assert_array_equal(piv_k, piv_l)
    assert_close(LU_k, LU_l, np.complex128, 24)


@pytest.mark.parametrize("path", ["kernel", "lapack"])
def test_singular_info(path):
    A = np.array(
        [
            [[1.0, 2.0], [2.0, 4.0]],  # rank 1: second pivot is zero
            [[0.0, 0.0], [0.0, 0.0]],  # zero: first pivot is zero
            [[1.0, 0.0], [0.0, 1.0]],
        ]
    )
    with cpu_path(path):
        LU, piv, info = lu_core.lu_factor_ex(A)
    assert info.tolist() == [2, 1, 0]
    assert np.isfinite(LU).all()
    P, L, U = lu_core.lu_unpack(LU, piv)
    np.testing.assert_allclose(P @ L @ U, A)


def test_lu_factor_raises_naming_batch_indices():
    A = np.stack([np.eye(3), np.eye(3), np.zeros((3, 3)), np.eye(3)]).reshape(2, 2, 3, 3)
    A[0, 0, 1] = A[0, 0, 0]  # duplicate row
    with pytest.raises(lu_core.SingularMatrixError) as excinfo:
        lu_core.lu_factor(A)
    err = excinfo.value
    assert err.indices == [(0, 0), (1, 0)]
    assert err.info == [2, 1]
    assert "batch index (0, 0)" in str(err)
    assert isinstance(err, lu_core.LinAlgError) and isinstance(err, np.linalg.LinAlgError)
    with pytest.raises(lu_core.SingularMatrixError):
        lu_core.lu_factor_ex(A, check_errors=True)
    _, _, info = lu_core.lu_factor_ex(A)  # never raises by default
    assert info.reshape(-1).tolist() == [2, 0, 1, 0]


def test_unbatched_singular_message():
    with pytest.raises(lu_core.SingularMatrixError, match="the input is singular: U\\[1, 1\\]"):
        lu_core.lu_factor(np.array([[1.0, 1.0], [1.0, 1.0]]))


def test_rectangular_rank_deficient_raises_like_torch():
    with pytest.raises(lu_core.SingularMatrixError):
        lu_core.lu_factor(np.zeros((3, 2)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 4), (2, 5, 3), (3, 3, 6), (2, 60, 60)], ids=str)
def test_no_pivoting(rng, shape, dtype):
    A = random_matrix(rng, shape, dtype)
    m, n = shape[-2:]
    A[..., : min(m, n), : min(m, n)] += 4 * max(m, n) * np.eye(min(m, n), dtype=dtype)
    LU, piv, info = lu_core.lu_factor_ex(A, pivot=False)
    k = min(m, n)
    np.testing.assert_array_equal(piv, np.broadcast_to(np.arange(1, k + 1, dtype=np.int32), piv.shape))
    assert not info.any()
    P, L, U = lu_core.lu(A, pivot=False)
    assert P is None
    assert_close(L @ U, A, dtype, max(m, n))
    LU_ref, _, _ = _reference.lu_factor_ex(A, pivot=False)
    assert_close(LU, LU_ref, dtype, max(m, n))


@pytest.mark.parametrize("order", ["C", "F"])
def test_input_not_modified(rng, order):
    for shape in [(3, 5, 5), (1, 70, 70)]:
        A = np.asarray(rng.standard_normal(shape), order=order)
        if order == "F":
            A = np.ascontiguousarray(A.swapaxes(-1, -2)).swapaxes(-1, -2)  # column-major per matrix
        before = A.copy()
        lu_core.lu_factor(A)
        lu_core.lu(A)
        np.testing.assert_array_equal(A, before)


def test_non_contiguous_input(rng):
    big = rng.standard_normal((4, 10, 12))
    A = big[::2, 1:8:2, ::3]  # strided view
    LU, piv = lu_core.lu_factor(A)
    P, L, U = lu_core.lu_unpack(LU, piv)
    np.testing.assert_allclose(P @ L @ U, A, atol=1e-12)


@pytest.mark.parametrize("path", ["kernel", "lapack"])
@pytest.mark.parametrize("layout", ["C", "F", "strided"])
@pytest.mark.parametrize("shape", [(3, 19, 19), (2, 17, 11), (2, 11, 17), (1, 9, 9), (2, 259, 257)], ids=str)
def test_every_input_layout_gives_the_same_factorization(rng, shape, layout, path):
    """Each path copies the input into its storage its own way (LAPACK's pool threads transpose a
    C-ordered matrix just before factoring it; above LAPACK_POOL_MAX_N the batch is copied first):
    every layout gives the bits of a C-ordered copy."""
    A = random_matrix(rng, shape, np.float64)
    if layout == "F":
        given = np.ascontiguousarray(A.swapaxes(-1, -2)).swapaxes(-1, -2)  # column-major per matrix
    elif layout == "strided":
        big = np.zeros((shape[0], 2 * shape[1], 3 * shape[2]))
        big[:, ::2, ::3] = A
        given = big[:, ::2, ::3]
    else:
        given = A
    with cpu_path(path):
        LU, piv, info = lu_core.lu_factor_ex(given)
        LU_c, piv_c, info_c = lu_core.lu_factor_ex(np.ascontiguousarray(A))
    np.testing.assert_array_equal(LU, LU_c)
    np.testing.assert_array_equal(piv, piv_c)
    np.testing.assert_array_equal(info, info_c)
    if max(shape[-2:]) < 64:  # the reference is plain Python: seconds at n = 259, where the bits above suffice
        LU_ref, piv_ref, _ = _reference.lu_factor_ex(A)
        np.testing.assert_array_equal(piv, piv_ref)
        assert_close(LU, LU_ref, np.float64, max(shape[-2:]))


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint16])
def test_integers_promote_to_float64(dtype):
    A = np.array([[2, 1], [4, 3]], dtype=dtype)
    LU, piv = lu_core.lu_factor(A)
    assert LU.dtype == np.float64
    np.testing.assert_array_equal(piv, [2, 2])


def test_nested_lists_accepted():
    LU, piv = lu_core.lu_factor([[2.0, 1.0], [4.0, 3.0]])
    assert LU.dtype == np.float64 and piv.tolist() == [2, 2]


@pytest.mark.parametrize("path", ["kernel", "lapack"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_keeps_pivots_in_range(rng, bad, path):
    A = rng.standard_normal((3, 6, 6))
    A[0, 2, 3] = bad
    A[1, :, 0] = bad
    with cpu_path(path):
        LU, piv, _info = lu_core.lu_factor_ex(A)
    assert piv.min() >= 1 and piv.max() <= 6
    assert np.isfinite(LU[2]).all()  # untouched matrices are unaffected
    P, _, _ = lu_core.lu_unpack(LU, piv)  # pivots remain usable
    assert (P.sum(axis=-1) == 1).all()


def test_complex_pivot_uses_lapack_magnitude():
    # |re| + |im| picks row 0 (4 > 3); the modulus would pick row 1 (2.83 < 3).
    A = np.array([[2 + 2j, 1], [3 + 0j, 1]], dtype=np.complex128)
    _, piv = lu_core.lu_factor(A)
    _, piv_ref = scipy.linalg.lu_factor(A)
    assert piv.tolist() == (piv_ref + 1).tolist() == [1, 2]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("pivot", [True, False])
def test_a_subnormal_pivot_divides_instead_of_overflowing(dtype, pivot):
    """LAPACK's getf2: below the smallest normal number the column is divided by the pivot, whose
    reciprocal would overflow (inf multipliers, then NaN in U)."""
    tiny = np.finfo(dtype).tiny
    A = np.array([[tiny / 10, 1.0, 2.0], [tiny / 20, 1.0, 3.0], [tiny / 40, 2.0, 1.0]], dtype)
    A = np.stack([A, A * np.random.default_rng(0).uniform(0.5, 2.0, size=(3, 3)).astype(dtype)])
    LU, piv, info = lu_core.lu_factor_ex(A, pivot=pivot)
    assert np.isfinite(LU).all() and (info == 0).all()
    P, L, U = lu_core.lu_unpack(LU, piv)
    np.testing.assert_allclose(P @ L @ U, A, rtol=1e-5, atol=1e-5)
    multipliers = LU[0, 1:, 0]  # (tiny / 20) / (tiny / 10) and (tiny / 40) / (tiny / 10), in some order
    np.testing.assert_allclose(np.sort(multipliers.real), [0.25, 0.5], rtol=1e-3)
