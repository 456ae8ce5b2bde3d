"""lu_rcond against LAPACK's ?gecon (through SciPy) and the exact 1 / (||A|| ||A^-1||)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import lapack

import lu_core
from tests.helpers import DTYPES, random_matrix, well_conditioned
from tests.lu_core.test_refine import conditioned

GECON = {
    np.dtype(np.float32): lapack.sgecon,
    np.dtype(np.float64): lapack.dgecon,
    np.dtype(np.complex64): lapack.cgecon,
    np.dtype(np.complex128): lapack.zgecon,
}
NORM_AXIS = {"1": -2, "inf": -1}  # summed over rows for the 1-norm, over columns for the inf-norm


def anorm(A: np.ndarray, norm: str) -> np.ndarray:
    return np.abs(A).sum(axis=NORM_AXIS[norm]).max(axis=-1)


def exact(A: np.ndarray, norm: str) -> np.ndarray:
    A = A.astype(np.complex128 if np.iscomplexobj(A) else np.float64)
    return 1.0 / (anorm(A, norm) * anorm(np.linalg.inv(A), norm))


@pytest.mark.parametrize("norm", ["1", "inf"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (5, 5), (3, 2, 7, 7), (2, 60, 60)])
def test_matches_lapack_gecon_and_bounds_the_exact_value(rng, norm, dtype, shape):
    A = random_matrix(rng, shape, dtype)
    LU, piv = lu_core.lu_factor(A)
    an = anorm(A, norm)
    rc = lu_core.lu_rcond(LU, piv, an, norm=norm)
    real = np.finfo(np.dtype(dtype)).dtype
    assert rc.shape == shape[:-2] and rc.dtype == real
    n = shape[-1]
    want = np.array(
        [GECON[np.dtype(dtype)](np.asfortranarray(m), a, norm="1" if norm == "1" else "I")[0]
         for m, a in zip(LU.reshape(-1, n, n), np.ravel(an), strict=True)]
    ).reshape(shape[:-2])  # fmt: skip
    rtol = 1e-3 if real == np.float32 else 1e-10
    np.testing.assert_allclose(rc, want, rtol=rtol)
    # ||A^-1|| is estimated from below, so the estimate is never below the truth (up to rounding) ...
    truth = exact(A, norm)
    assert (rc >= truth * (1 - 1e3 * np.finfo(real).eps)).all()
    # ... and, for these matrices, not far above it.
    assert (rc <= 10 * truth).all()


@pytest.mark.parametrize("norm", ["1", "inf"])
def test_ill_conditioned(rng, norm):
    A = conditioned(rng, 50, 1e13)
    LU, piv = lu_core.lu_factor(A)
    rc = lu_core.lu_rcond(LU, piv, anorm(A, norm), norm=norm)
    want = lapack.dgecon(np.asfortranarray(LU), anorm(A, norm), norm="1" if norm == "1" else "I")[0]
    np.testing.assert_allclose(rc, want, rtol=1e-8)
    assert 1e-15 < rc < 1e-11


def test_a_batch_equals_each_matrix_alone(rng):
    A = well_conditioned(rng, (7, 9, 9), np.complex128)
    LU, piv = lu_core.lu_factor(A)
    an = anorm(A, "1")
    batch = lu_core.lu_rcond(LU, piv, an)
    alone = [lu_core.lu_rcond(LU[i], piv[i], an[i]) for i in range(7)]
    np.testing.assert_array_equal(batch, np.array(alone))


def test_anorm_scalar_broadcast_and_special_values(rng):
    A = well_conditioned(rng, (4, 5, 5), np.float64)
    LU, piv = lu_core.lu_factor(A)
    one = lu_core.lu_rcond(LU, piv, 2.0)
    np.testing.assert_array_equal(one, lu_core.lu_rcond(LU, piv, np.full(4, 2.0)))
    np.testing.assert_array_equal(one, lu_core.lu_rcond(LU, piv, np.array([2.0])))
    special = lu_core.lu_rcond(LU, piv, np.array([0.0, np.inf, np.nan, 1]))
    assert special[0] == 0 and special[1] == 0 and np.isnan(special[2]) and special[3] > 0


def test_singular_empty_and_non_finite(rng):
    A = well_conditioned(rng, (3, 4, 4), np.float64)
    LU, piv, _ = lu_core.lu_factor_ex(A)
    LU[1, 2, 2] = 0.0
    LU[2, 0, 1] = np.nan
    rc = lu_core.lu_rcond(LU, piv, 1.0)
    assert rc[0] > 0 and rc[1] == 0 and np.isnan(rc[2])
    assert lu_core.lu_rcond(np.ones((0, 0)), np.ones(0, np.int32), 1.0) == 1
    assert lu_core.lu_rcond(np.ones((0, 3, 3)), np.ones((0, 3), np.int32), 1.0).shape == (0,)
    assert lu_core.lu_rcond(np.array([[4.0]]), np.array([1]), 4.0) == 1.0


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "argument"),
    [
        ((np.eye(3), np.ones(3, np.int32), -1.0), {}, lu_core.InvalidInputError, "anorm"),
        ((np.eye(3), np.ones(3, np.int32), 1.0), {"norm": "2"}, lu_core.InvalidInputError, "norm"),
        ((np.eye(3), np.ones(3, np.int32), 1.0), {"norm": None}, lu_core.InvalidInputError, "norm"),
        ((np.eye(3), np.ones(3, np.int32), 1.0), {"norm": "fro"}, lu_core.InvalidInputError, "norm"),
        ((np.eye(3), np.array([1, 2, 4]), 1.0), {}, lu_core.PivotError, "pivots"),
        ((np.eye(3), np.array([0, 2, 3]), 1.0), {}, lu_core.PivotError, "pivots"),
        ((np.eye(3), np.ones(2, np.int32), 1.0), {}, lu_core.ShapeError, "pivots"),
        ((np.ones((3, 4)), np.ones(3, np.int32), 1.0), {}, lu_core.ShapeError, "LU"),
        ((np.ones(3), np.ones(3, np.int32), 1.0), {}, lu_core.ShapeError, "LU"),
        ((np.eye(3), np.ones(3), 1.0), {}, lu_core.DTypeError, "pivots"),
        ((np.ones((2, 3, 3)), np.ones((2, 3), np.int32), np.ones(3)), {}, lu_core.ShapeError, "anorm"),
        ((np.eye(3), np.ones(3, np.int32), np.array(1j)), {}, lu_core.DTypeError, "anorm"),
        ((np.eye(3), np.ones(3, np.int32), "big"), {}, lu_core.DTypeError, "anorm"),
        ((np.eye(3), np.ones(3, np.int32), 2**2000), {}, lu_core.InvalidInputError, "anorm"),  # was OverflowError
        ((np.eye(3), np.ones(3, np.int32), -(2**2000)), {}, lu_core.InvalidInputError, "anorm"),
        ((np.eye(3), np.ones(3, np.int32), 10**5000), {}, lu_core.InvalidInputError, "anorm"),  # past repr's digits
    ],
)
def test_bad_arguments(args, kwargs, error, argument):
    with pytest.raises(error) as excinfo:
        lu_core.lu_rcond(*args, **kwargs)
    assert excinfo.value.argument == argument and isinstance(excinfo.value, ValueError)


def test_norm_accepts_numbers_like_numpy(rng):
    A = well_conditioned(rng, (5, 5), np.float64)
    LU, piv = lu_core.lu_factor(A)
    assert lu_core.lu_rcond(LU, piv, 1.0, norm=1) == lu_core.lu_rcond(LU, piv, 1.0, norm="1")
    assert lu_core.lu_rcond(LU, piv, 1.0, norm=np.inf) == lu_core.lu_rcond(LU, piv, 1.0, norm="inf")
