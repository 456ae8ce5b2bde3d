from __future__ import annotations

import numpy as np
import pytest

import lu_core
from lu_core import _reference


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64])
def test_any_integer_dtype_returns_int32(dtype):
    piv = np.array([[3, 3, 3], [1, 2, 3]], dtype=dtype)
    perm = lu_core.pivots_to_permutation(piv, 3)
    assert perm.dtype == np.int32
    assert perm.tolist() == [[2, 0, 1], [0, 1, 2]]


@pytest.mark.parametrize(("batch", "k", "m"), [((), 0, 0), ((), 3, 5), ((2, 3), 6, 6), ((0,), 2, 4), ((4,), 0, 3)])
def test_matches_reference(rng, batch, k, m):
    piv = rng.integers(1, m + 1, size=(*batch, k)) if m else np.zeros((*batch, k), int)
    perm = lu_core.pivots_to_permutation(piv, m)
    assert perm.shape == (*batch, m)
    np.testing.assert_array_equal(perm, _reference.pivots_to_permutation(piv, m))


def test_definition_against_a_factorization(rng):
    A = rng.standard_normal((5, 9, 6))
    LU, piv = lu_core.lu_factor(A)
    _, L, U = lu_core.lu_unpack(LU, piv, unpack_pivots=False)
    perm = lu_core.pivots_to_permutation(piv, 9)
    np.testing.assert_allclose(np.take_along_axis(A, perm[..., None], axis=-2), L @ U, atol=1e-12)
    P, _, _ = lu_core.lu_unpack(LU, piv)
    rows = np.argmax(P, axis=-2)  # P[perm[j], j] = 1
    np.testing.assert_array_equal(rows, perm)


@pytest.mark.parametrize(
    "pivots",
    [
        np.broadcast_to(np.arange(1, 4, dtype=np.int32), (5, 3)),  # identity pivots, as lu_rcond builds them
        np.arange(1, 4, dtype=np.int32).reshape(1, 3),  # already int32 and contiguous: still a new array
        np.asfortranarray(np.tile(np.arange(1, 5, dtype=np.int64), (3, 1))),
    ],
)
def test_own_pivots_are_a_new_c_ordered_zero_based_array(pivots):
    """The kernels are compiled for C-ordered pivots: a broadcast or Fortran-ordered input must not reach
    them as is (a second compilation, ~2 s a dtype), and the caller's 1-based pivots stay as they were."""
    from lu_core._cpu.backend import CPU_BACKEND

    before = pivots.copy()
    piv0 = CPU_BACKEND.own_pivots(pivots)
    assert piv0.dtype == np.int32 and piv0.flags.c_contiguous and piv0.flags.writeable
    assert not np.shares_memory(piv0, pivots)
    np.testing.assert_array_equal(piv0, before.reshape(-1, before.shape[-1]) - 1)
    np.testing.assert_array_equal(pivots, before)
