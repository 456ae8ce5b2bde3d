from __future__ import annotations

import numpy as np
import pytest

import lu_core
from lu_core import _reference
from tests.helpers import DTYPES, FACTOR_SHAPES, random_matrix


@pytest.mark.parametrize("layout", ["C", "F"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [s for s in FACTOR_SHAPES if np.prod(s) < 2000], ids=str)
def test_bit_identical_to_reference(rng, shape, dtype, layout):
    # Any packed matrix and any valid pivots: unpacking is pure data movement.
    LU = random_matrix(rng, shape, dtype)
    if layout == "F":
        LU = np.ascontiguousarray(LU.swapaxes(-1, -2)).swapaxes(-1, -2)
    m, n = shape[-2:]
    k = min(m, n)
    piv = rng.integers(1, m + 1, size=(*shape[:-2], k)) if m else np.zeros((*shape[:-2], 0), int)
    piv = np.maximum(piv, np.arange(1, k + 1))  # LAPACK pivots never point above the row
    P, L, U = lu_core.lu_unpack(LU, piv)
    P_ref, L_ref, U_ref = _reference.lu_unpack(LU, piv)
    for got, want in [(P, P_ref), (L, L_ref), (U, U_ref)]:
        assert got.dtype == np.dtype(dtype) and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_any_in_range_pivots_accepted(rng):
    # Pivots below the row index are legal (LAPACK never makes them, but they are in range).
    LU = rng.standard_normal((4, 4))
    piv = np.array([4, 1, 1, 2])
    P, _, _ = lu_core.lu_unpack(LU, piv)
    P_ref, _, _ = _reference.lu_unpack(LU, piv)
    np.testing.assert_array_equal(P, P_ref)


@pytest.mark.parametrize(("data", "pivots"), [(True, False), (False, True), (False, False)])
def test_entries_not_asked_for_are_none(rng, data, pivots):
    LU, piv = lu_core.lu_factor(rng.standard_normal((2, 5, 5)))
    P, L, U = lu_core.lu_unpack(LU, piv, unpack_data=data, unpack_pivots=pivots)
    assert (P is None) == (not pivots)
    assert (L is None) == (not data) and (U is None) == (not data)


def test_outputs_do_not_alias_input(rng):
    LU, piv = lu_core.lu_factor(rng.standard_normal((3, 4, 4)))
    before = LU.copy()
    _P, L, U = lu_core.lu_unpack(LU, piv)
    L[...] = 7
    U[...] = 7
    np.testing.assert_array_equal(LU, before)


def test_large_single_matrix(rng):
    A = rng.standard_normal((300, 300))
    LU, piv = lu_core.lu_factor(A)
    P, L, U = lu_core.lu_unpack(LU, piv)
    np.testing.assert_allclose(P @ L @ U, A, atol=1e-10)
    np.testing.assert_array_equal(np.tril(L, -1), np.tril(LU, -1))
    np.testing.assert_array_equal(np.triu(U), np.triu(LU))
    np.testing.assert_array_equal(np.diag(L), np.ones(300))
