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
