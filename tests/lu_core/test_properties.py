"""Property-based tests over random shapes, batch shapes and dtypes."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import lu_core
from lu_core import _reference
from tests.helpers import DTYPES, assert_close

batch_shapes = hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3)
dims = st.integers(min_value=0, max_value=9)
dtypes = st.sampled_from(DTYPES)
seeds = st.integers(min_value=0, max_value=2**32 - 1)


def _random(seed, shape, dtype):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if np.issubdtype(np.dtype(dtype), np.complexfloating):
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


@given(batch=batch_shapes, m=dims, n=dims, dtype=dtypes, seed=seeds)
def test_factor_unpack_roundtrip(batch, m, n, dtype, seed):
    A = _random(seed, (*batch, m, n), dtype)
    LU, piv, info = lu_core.lu_factor_ex(A)
    P, L, U = lu_core.lu_unpack(LU, piv)
    assert_close(P @ L @ U, A, dtype, max(m, n, 1))
    _, piv_ref, info_ref = _reference.lu_factor_ex(A)
    np.testing.assert_array_equal(piv, piv_ref)
    np.testing.assert_array_equal(info, info_ref)


@given(
    lu_batch=batch_shapes,
    b_batch=batch_shapes,
    n=st.integers(1, 8),
    nrhs=st.integers(0, 3),
    dtype=dtypes,
    left=st.booleans(),
    adjoint=st.booleans(),
    seed=seeds,
)
def test_solve_residual_with_broadcasting(lu_batch, b_batch, n, nrhs, dtype, left, adjoint, seed):
    try:
        out_batch = np.broadcast_shapes(lu_batch, b_batch)
    except ValueError:
        return
    A = _random(seed, (*lu_batch, n, n), dtype) + 3 * n * np.eye(n, dtype=dtype)
    B = _random(seed + 1, (*b_batch, n, nrhs) if left else (*b_batch, nrhs, n), dtype)
    LU, piv = lu_core.lu_factor(A)
    X = lu_core.lu_solve(LU, piv, B, left=left, adjoint=adjoint)
    assert X.shape == (*out_batch, *B.shape[-2:])
    opA = A.conj().swapaxes(-1, -2) if adjoint else A
    AX = opA @ X if left else X @ opA
    assert_close(AX, np.broadcast_to(B, AX.shape), dtype, n, scale=max(1.0, float(np.abs(B).max(initial=0))))


@given(batch=batch_shapes, m=st.integers(0, 12), k_frac=st.floats(0, 1), seed=seeds)
def test_permutation_is_a_permutation(batch, m, k_frac, seed):
    rng = np.random.default_rng(seed)
    k = int(k_frac * m)
    piv = rng.integers(1, m + 1, size=(*batch, k)) if m else np.zeros((*batch, 0), np.int64)
    perm = lu_core.pivots_to_permutation(piv, m)
    np.testing.assert_array_equal(np.sort(perm, axis=-1), np.broadcast_to(np.arange(m), perm.shape))
    np.testing.assert_array_equal(perm, _reference.pivots_to_permutation(piv, m))


@given(
    pivots=hnp.arrays(
        dtype=st.sampled_from([np.int8, np.int32, np.int64, np.uint16]),
        shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4),
    ),
    m=st.integers(1, 5),
)
def test_arbitrary_pivots_never_crash(pivots, m):
    """Random integers as pivots: either a PivotError/ShapeError or a valid permutation."""
    try:
        perm = lu_core.pivots_to_permutation(pivots, m)
    except (lu_core.PivotError, lu_core.ShapeError):
        assert pivots.shape[-1] > m or ((pivots < 1) | (pivots > m)).any()
        return
    assert ((pivots >= 1) & (pivots <= m)).all()
    np.testing.assert_array_equal(np.sort(perm, axis=-1), np.broadcast_to(np.arange(m), perm.shape))
