"""``lu_core.vjp`` and ``lu_core.jvp`` without PyTorch: central finite differences in
float64 and complex128 (real and imaginary directions), the adjoint identity
``<vjp(g), t> == <g, jvp(t)>`` for every operation and shape, consistency between
the operations, and every error path."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import lu_core
from lu_core import jvp, vjp
from tests.helpers import cpu_path, random_matrix, well_conditioned

H = 1e-6
FD_RTOL = 1e-6
ADJ_RTOL = 1e-10

FACTOR_SHAPES = [(4, 4), (6, 4), (4, 6), (2, 3, 5, 5), (3, 6, 4), (2, 4, 7), (1, 1), (5, 1), (1, 5)]
DOUBLE = [np.float64, np.complex128]


def inner(a: np.ndarray, b: np.ndarray) -> float:
    """The real inner product PyTorch's complex gradients are adjoint for."""
    return float(np.real(np.vdot(np.asarray(a), np.asarray(b))))


def directions(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> list[np.ndarray]:
    """Real dtypes: one random direction; complex: purely real, purely imaginary, and mixed."""
    t = random_matrix(rng, shape, dtype)
    if np.dtype(dtype).kind != "c":
        return [t]
    return [t.real.astype(dtype), (1j * t.imag).astype(dtype), t]


def central(f: Callable[[float], tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    plus, minus = f(H), f(-H)
    return tuple((p - m) / (2 * H) for p, m in zip(plus, minus, strict=True))


def assert_rel(actual: np.ndarray, expected: np.ndarray, rtol: float) -> None:
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    err = float(np.max(np.abs(actual - expected), initial=0.0))
    assert err <= rtol * scale, f"error {err:.3e} > {rtol * scale:.3e}"


def diag_dominant(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """Strictly diagonally dominant by columns: LU without pivoting is stable and pivots stay put."""
    a = random_matrix(rng, shape, dtype)
    m, n = shape[-2:]
    eye = np.eye(m, n, dtype=dtype)
    return (a + 3 * max(m, n) * eye).astype(dtype)


# --------------------------------------------------------------------- lu_factor


@pytest.mark.parametrize("pivot", [True, False])
@pytest.mark.parametrize("dtype", DOUBLE)
@pytest.mark.parametrize("shape", FACTOR_SHAPES, ids=str)
def test_lu_factor_finite_differences_and_adjoint(rng, shape, dtype, pivot):
    A = random_matrix(rng, shape, dtype) if pivot else diag_dominant(rng, shape, dtype)
    LU, piv = lu_core.lu_factor(A, pivot=pivot)
    g = random_matrix(rng, shape, dtype)
    gA = vjp.lu_factor(LU, piv, g, pivot=pivot)
    assert gA.shape == shape and gA.dtype == np.dtype(dtype)
    for t in directions(rng, shape, dtype):

        def f(h, t=t):
            LU_h, piv_h = lu_core.lu_factor(A + h * t, pivot=pivot)
            np.testing.assert_array_equal(piv_h, piv)  # the smooth piece: same permutation
            return (LU_h,)

        (fd,) = central(f)
        dLU = jvp.lu_factor(t, LU, piv, pivot=pivot)
        assert_rel(dLU, fd, FD_RTOL)
        assert inner(gA, t) == pytest.approx(inner(g, dLU), rel=ADJ_RTOL, abs=1e-12)


# ------------------------------------------------------------------------- lu


@pytest.mark.parametrize("dtype", DOUBLE)
@pytest.mark.parametrize("shape", FACTOR_SHAPES, ids=str)
def test_lu_finite_differences_and_adjoint(rng, shape, dtype):
    A = random_matrix(rng, shape, dtype)
    P, L, U = lu_core.lu(A)
    gL, gU = random_matrix(rng, L.shape, dtype), random_matrix(rng, U.shape, dtype)
    gA = vjp.lu(P, L, U, gL, gU)
    for t in directions(rng, shape, dtype):

        def f(h, t=t):
            P_h, L_h, U_h = lu_core.lu(A + h * t)
            np.testing.assert_array_equal(P_h, P)
            return L_h, U_h

        fd_L, fd_U = central(f)
        dL, dU = jvp.lu(t, P, L, U)
        assert_rel(dL, fd_L, FD_RTOL)
        assert_rel(dU, fd_U, FD_RTOL)
        assert inner(gA, t) == pytest.approx(inner(gL, dL) + inner(gU, dU), rel=ADJ_RTOL, abs=1e-12)


@pytest.mark.parametrize("shape", [(5, 5), (7, 4), (4, 7)], ids=str)
def test_lu_one_gradient_missing_is_zero(rng, shape):
    P, L, U = lu_core.lu(random_matrix(rng, shape, np.float64))
    gL, gU = random_matrix(rng, L.shape, np.float64), random_matrix(rng, U.shape, np.float64)
    both = vjp.lu(P, L, U, gL, gU)
    only_L, only_U = vjp.lu(P, L, U, gL, None), vjp.lu(P, L, U, None, gU)
    np.testing.assert_allclose(only_L + only_U, both, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(only_L, vjp.lu(P, L, U, gL, np.zeros_like(U)), rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(vjp.lu(P, L, U, None, None), np.zeros(shape))


@pytest.mark.parametrize("shape", [(5, 5), (7, 4), (4, 7), (2, 3, 3)], ids=str)
def test_lu_ignores_entries_the_factors_do_not_depend_on(rng, shape):
    P, L, U = lu_core.lu(random_matrix(rng, shape, np.float64))
    gL, gU = random_matrix(rng, L.shape, np.float64), random_matrix(rng, U.shape, np.float64)
    noisy_L = gL + np.triu(random_matrix(rng, L.shape, np.float64))  # unit diagonal, zeros above
    noisy_U = gU + np.tril(random_matrix(rng, U.shape, np.float64), -1)
    np.testing.assert_allclose(vjp.lu(P, L, U, noisy_L, noisy_U), vjp.lu(P, L, U, gL, gU), rtol=1e-11, atol=1e-11)


def test_lu_without_pivoting(rng):
    A = diag_dominant(rng, (3, 5, 5), np.float64)
    P, L, U = lu_core.lu(A, pivot=False)
    assert P is None
    gL, gU = random_matrix(rng, L.shape, np.float64), random_matrix(rng, U.shape, np.float64)
    LU, piv = lu_core.lu_factor(A, pivot=False)
    expected = vjp.lu_factor(LU, piv, vjp.lu_unpack(gL, gU, 5, 5), pivot=False)
    np.testing.assert_allclose(vjp.lu(None, L, U, gL, gU, pivot=False), expected, rtol=1e-12, atol=1e-12)
    t = random_matrix(rng, A.shape, np.float64)
    dL, dU = jvp.lu(t, None, L, U, pivot=False)
    dLU = jvp.lu_factor(t, LU, piv, pivot=False)
    np.testing.assert_allclose(dL, np.tril(dLU, -1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dU, np.triu(dLU), rtol=1e-12, atol=1e-12)


# ------------------------------------------------------- consistency between ops


@pytest.mark.parametrize("dtype", DOUBLE)
@pytest.mark.parametrize("shape", [(5, 5), (7, 4), (4, 7), (2, 3, 6, 6)], ids=str)
def test_lu_is_lu_factor_then_unpack(rng, shape, dtype):
    A = random_matrix(rng, shape, dtype)
    LU, piv = lu_core.lu_factor(A)
    P, L, U = lu_core.lu_unpack(LU, piv)
    m, n = shape[-2:]
    gL, gU = random_matrix(rng, L.shape, dtype), random_matrix(rng, U.shape, dtype)
    chained = vjp.lu_factor(LU, piv, vjp.lu_unpack(gL, gU, m, n))
    np.testing.assert_allclose(vjp.lu(P, L, U, gL, gU), chained, rtol=1e-11, atol=1e-11)
    t = random_matrix(rng, shape, dtype)
    dLU = jvp.lu_factor(t, LU, piv)
    dL, dU = jvp.lu(t, P, L, U)
    k = min(m, n)
    np.testing.assert_allclose(dL, np.tril(dLU[..., :, :k], -1), rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(dU, np.triu(dLU[..., :k, :]), rtol=1e-11, atol=1e-11)


# ------------------------------------------------------------------ lu_unpack


@pytest.mark.parametrize("dtype", DOUBLE)
@pytest.mark.parametrize("shape", [(4, 4), (6, 3), (3, 6), (2, 5, 4), (0, 3), (0, 2, 2)], ids=str)
def test_lu_unpack_adjoint(rng, shape, dtype):
    m, n = shape[-2:]
    LU = random_matrix(rng, shape, dtype)
    piv = np.broadcast_to(np.arange(1, min(m, n) + 1, dtype=np.int32), (*shape[:-2], min(m, n)))
    _, L, U = lu_core.lu_unpack(LU, piv)
    gL, gU = random_matrix(rng, L.shape, dtype), random_matrix(rng, U.shape, dtype)
    gLU = vjp.lu_unpack(gL, gU, m, n)
    assert gLU.shape == shape
    t = random_matrix(rng, shape, dtype)
    _, dL, dU = lu_core.lu_unpack(t, piv)  # unpacking is linear in LU (L's unit diagonal aside)
    dL = np.tril(dL, -1)
    assert inner(gLU, t) == pytest.approx(inner(gL, dL) + inner(gU, dU), rel=ADJ_RTOL, abs=1e-12)
    np.testing.assert_array_equal(vjp.lu_unpack(gL, None, m, n) + vjp.lu_unpack(None, gU, m, n), gLU)


# ------------------------------------------------------------------- lu_solve

SOLVE_CASES = [
    ((4, 4), (4, 2)),
    ((3, 5, 5), (3, 5, 1)),
    ((2, 1, 4, 4), (3, 4, 2)),  # both broadcast
    ((4, 4), (2, 3, 4, 3)),  # LU broadcast along B's batch
    ((2, 3, 3), (3, 1)),  # B broadcast along LU's batch
    ((1, 1), (1, 1)),
]


def _rhs_shape(b_shape: tuple[int, ...], left: bool) -> tuple[int, ...]:
    return b_shape if left else (*b_shape[:-2], b_shape[-1], b_shape[-2])


@pytest.mark.parametrize("adjoint", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("dtype", DOUBLE)
@pytest.mark.parametrize(("lu_shape", "b_shape"), SOLVE_CASES, ids=str)
def test_lu_solve_finite_differences_and_adjoint(rng, lu_shape, b_shape, dtype, left, adjoint):
    A = well_conditioned(rng, lu_shape, dtype)
    LU, piv = lu_core.lu_factor(A)
    B = random_matrix(rng, _rhs_shape(b_shape, left), dtype)
    X = lu_core.lu_solve(LU, piv, B, left=left, adjoint=adjoint)
    gX = random_matrix(rng, X.shape, dtype)
    gLU, gB = vjp.lu_solve(LU, piv, B, X, gX, left=left, adjoint=adjoint)
    assert gLU.shape == LU.shape and gB.shape == B.shape
    for tLU, tB in zip(directions(rng, LU.shape, dtype), directions(rng, B.shape, dtype), strict=True):

        def f(h, tLU=tLU, tB=tB):
            return (lu_core.lu_solve(LU + h * tLU, piv, B + h * tB, left=left, adjoint=adjoint),)

        (fd,) = central(f)
        dX = jvp.lu_solve(LU, piv, X, tLU, tB, left=left, adjoint=adjoint)
        assert_rel(dX, fd, FD_RTOL)
        assert inner(gLU, tLU) + inner(gB, tB) == pytest.approx(inner(gX, dX), rel=ADJ_RTOL, abs=1e-12)
        only_LU = jvp.lu_solve(LU, piv, X, tLU, None, left=left, adjoint=adjoint)
        only_B = jvp.lu_solve(LU, piv, X, None, tB, left=left, adjoint=adjoint)
        np.testing.assert_allclose(only_LU + only_B, dX, rtol=1e-10, atol=1e-10)


def test_lu_solve_grad_b_is_solve_with_the_adjoint(rng):
    A = well_conditioned(rng, (3, 5, 5), np.complex128)
    LU, piv = lu_core.lu_factor(A)
    B = random_matrix(rng, (3, 5, 2), np.complex128)
    X = lu_core.lu_solve(LU, piv, B)
    gX = random_matrix(rng, X.shape, np.complex128)
    _, gB = vjp.lu_solve(LU, piv, B, X, gX)
    np.testing.assert_allclose(gB, np.linalg.solve(np.conj(np.swapaxes(A, -1, -2)), gX), rtol=1e-12)


def test_lu_solve_mixed_dtypes_give_gradients_in_each_inputs_dtype(rng):
    A = well_conditioned(rng, (4, 4), np.float32)
    LU, piv = lu_core.lu_factor(A)
    B = random_matrix(rng, (4, 2), np.complex128)
    X = lu_core.lu_solve(LU, piv, B)
    assert X.dtype == np.complex128
    gLU, gB = vjp.lu_solve(LU, piv, B, X, random_matrix(rng, X.shape, np.complex128))
    assert gLU.dtype == np.float32 and gB.dtype == np.complex128
    dX = jvp.lu_solve(LU, piv, X, random_matrix(rng, LU.shape, np.float32), random_matrix(rng, B.shape, np.float64))
    assert dX.dtype == np.complex128


# ---------------------------------------------------------------------- solve

SOLVE_VECTOR_CASES = [
    ((4, 4), (4, 3)),
    ((3, 5, 5), (3, 5, 2)),
    ((2, 1, 4, 4), (3, 4, 2)),
    ((4, 4), (4,)),  # a vector
    ((3, 4, 4), (3, 4)),  # a batch of vectors
    ((3, 4, 4), (4,)),  # one vector broadcast
]


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("dtype", DOUBLE)
@pytest.mark.parametrize(("a_shape", "b_shape"), SOLVE_VECTOR_CASES, ids=str)
def test_solve_finite_differences_and_adjoint(rng, a_shape, b_shape, dtype, left):
    A = well_conditioned(rng, a_shape, dtype)
    vector = len(b_shape) == 1 or b_shape == a_shape[:-1]
    if vector and not left:  # refused, by solve as by torch.linalg.solve, and so by its vjp and jvp
        B = random_matrix(rng, b_shape, dtype)
        with pytest.raises(lu_core.ShapeError, match="^B: .* left=False"):
            vjp.solve(A, B, B, B, left=False)
        with pytest.raises(lu_core.ShapeError, match="^X: .* left=False"):
            jvp.solve(A, B, None, B, left=False)
        return
    B = random_matrix(rng, b_shape if vector else _rhs_shape(b_shape, left), dtype)
    X = lu_core.solve(A, B, left=left)
    gX = random_matrix(rng, X.shape, dtype)
    gA, gB = vjp.solve(A, B, X, gX, left=left)
    assert gA.shape == A.shape and gB.shape == B.shape
    for tA, tB in zip(directions(rng, A.shape, dtype), directions(rng, B.shape, dtype), strict=True):

        def f(h, tA=tA, tB=tB):
            return (lu_core.solve(A + h * tA, B + h * tB, left=left),)

        (fd,) = central(f)
        dX = jvp.solve(A, X, tA, tB, left=left)
        assert_rel(dX, fd, FD_RTOL)
        assert inner(gA, tA) + inner(gB, tB) == pytest.approx(inner(gX, dX), rel=ADJ_RTOL, abs=1e-12)


def test_solve_equals_factor_then_lu_solve(rng):
    A = well_conditioned(rng, (2, 5, 5), np.float64)
    B = random_matrix(rng, (2, 5, 3), np.float64)
    X = lu_core.solve(A, B)
    gX = random_matrix(rng, X.shape, np.float64)
    gA, gB = vjp.solve(A, B, X, gX)
    LU, piv = lu_core.lu_factor(A)
    gLU, gB2 = vjp.lu_solve(LU, piv, B, X, gX)
    np.testing.assert_allclose(gB, gB2, rtol=1e-12)
    np.testing.assert_allclose(gA, vjp.lu_factor(LU, piv, gLU), rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------- empty and odd


@pytest.mark.parametrize("shape", [(0, 0), (0, 3, 3), (3, 0), (0, 4), (2, 0, 0)], ids=str)
def test_empty_inputs(shape):
    A = np.zeros(shape)
    LU, piv, _ = lu_core.lu_factor_ex(A)
    assert vjp.lu_factor(LU, piv, A).shape == shape
    assert jvp.lu_factor(A, LU, piv).shape == shape
    P, L, U = lu_core.lu_unpack(LU, piv)
    assert vjp.lu(P, L, U, L, U).shape == shape
    dL, dU = jvp.lu(A, P, L, U)
    assert dL.shape == L.shape and dU.shape == U.shape


def test_empty_solves():
    LU, piv = np.zeros((0, 3, 3)), np.zeros((0, 3), np.int32)
    B = np.zeros((0, 3, 2))
    gLU, gB = vjp.lu_solve(LU, piv, B, B, B)
    assert gLU.shape == LU.shape and gB.shape == B.shape
    assert jvp.lu_solve(LU, piv, B, LU, B).shape == B.shape
    A, b = np.zeros((0, 0)), np.zeros((0, 4))
    gA, gb = vjp.solve(A, b, b, b)
    assert gA.shape == (0, 0) and gb.shape == (0, 4)
    assert jvp.solve(A, b, A, b).shape == (0, 4)


def test_non_finite_values_propagate(rng):
    A = well_conditioned(rng, (4, 4), np.float64)
    LU, piv = lu_core.lu_factor(A)
    g = random_matrix(rng, A.shape, np.float64)
    g[1, 2] = np.nan
    g[0, 0] = np.inf
    assert not np.isfinite(vjp.lu_factor(LU, piv, g)).all()
    assert not np.isfinite(jvp.lu_factor(g, LU, piv)).all()


def test_integer_inputs_promote_to_float64(rng):
    A = np.array([[4, 3], [6, 3]])
    LU, piv = lu_core.lu_factor(A)
    gA = vjp.lu_factor(LU, piv, np.ones((2, 2), dtype=np.int64))
    assert gA.dtype == np.float64
    gA2, gB = vjp.solve(A, np.array([1, 2]), lu_core.solve(A, np.array([1, 2])), np.ones(2, dtype=np.int32))
    assert gA2.dtype == np.float64 and gB.dtype == np.float64


def test_deeply_nested_batch(rng):
    A = well_conditioned(rng, (1,) * 20 + (3, 3), np.float64)
    LU, piv = lu_core.lu_factor(A)
    gA = vjp.lu_factor(LU, piv, np.ones_like(A))
    assert gA.shape == A.shape
    flat = vjp.lu_factor(LU.reshape(3, 3), piv.reshape(3), np.ones((3, 3)))
    np.testing.assert_allclose(gA.reshape(3, 3), flat, rtol=1e-14)


# --------------------------------------------------------------------- errors

E = lu_core.ShapeError
D = lu_core.DTypeError


def _lu_args():
    A = np.array([[4.0, 3.0, 1.0], [6.0, 3.0, 2.0], [1.0, 5.0, 7.0]])
    LU, piv = lu_core.lu_factor(A)
    P, L, U = lu_core.lu(A)
    return A, LU, piv, P, L, U


def _cases():
    A, LU, piv, P, L, U = _lu_args()
    B = np.ones((3, 2))
    X = lu_core.lu_solve(LU, piv, B)
    z = np.zeros((3, 3))
    c = np.zeros((3, 3), complex)
    return [
        # vjp.lu_factor
        (lambda: vjp.lu_factor(LU[0], piv, z), E, "LU"),
        (lambda: vjp.lu_factor(LU, piv, np.zeros((3, 4))), E, "grad_LU"),
        (lambda: vjp.lu_factor(LU, piv, np.zeros((2, 3, 3))), E, "grad_LU"),
        (lambda: vjp.lu_factor(LU, piv, c), D, "grad_LU"),
        (lambda: vjp.lu_factor(LU, piv.astype(float), z), D, "pivots"),
        (lambda: vjp.lu_factor(LU, np.array([1, 2, 4]), z), lu_core.PivotError, "pivots"),
        (lambda: vjp.lu_factor(LU, np.array([0, 2, 3]), z), lu_core.PivotError, "pivots"),
        (lambda: vjp.lu_factor(LU, piv[:2], z), E, "pivots"),
        (lambda: vjp.lu_factor(LU, None, z), E, "pivots"),
        (lambda: vjp.lu_factor(LU.astype(np.float16), piv, z), D, "LU"),
        (lambda: vjp.lu_factor(LU.astype(object), piv, z), D, "LU"),
        (lambda: vjp.lu_factor(LU, piv, z, pivot="yes"), lu_core.InvalidInputError, "pivot"),
        (lambda: vjp.lu_factor([[1.0, 2.0], [3.0]], piv, z), D, "LU"),
        # vjp.lu
        (lambda: vjp.lu(P, L, U[:, :2], None, None), E, "L, U"),
        (lambda: vjp.lu(P, L[None], U, None, None), E, "L, U"),
        (lambda: vjp.lu(P[:2], L, U, None, None), E, "P"),
        (lambda: vjp.lu(None, L, U, None, None), E, "P"),
        (lambda: vjp.lu(P, L, U, np.zeros((3, 2)), None), E, "grad_L"),
        (lambda: vjp.lu(P, L, U, None, c), D, "grad_U"),
        (lambda: vjp.lu(P, L, None, None, None), E, "U"),
        (lambda: vjp.lu(P.astype(complex), L, U, None, None), D, "P"),
        (lambda: vjp.lu(P, L, U, None, None, pivot=np.array([True, False])), lu_core.InvalidInputError, "pivot"),
        # vjp.lu_unpack
        (lambda: vjp.lu_unpack(None, None, 3, 3), E, "grad_L, grad_U"),
        (lambda: vjp.lu_unpack(z, z, -1, 3), E, "m"),
        (lambda: vjp.lu_unpack(z, z, 3, 2.5), E, "n"),
        (lambda: vjp.lu_unpack(z, z, 3, True), E, "n"),
        (lambda: vjp.lu_unpack(np.zeros((3, 2)), z, 3, 3), E, "grad_L"),
        (lambda: vjp.lu_unpack(z, np.zeros((2, 3)), 3, 3), E, "grad_U"),
        (lambda: vjp.lu_unpack(np.zeros((2, 3, 3)), np.zeros((4, 3, 3)), 3, 3), E, "grad_L, grad_U"),
        (lambda: vjp.lu_unpack(np.zeros(3), None, 3, 3), E, "grad_L"),
        (lambda: vjp.lu_unpack(z, None, 2**31 - 1, 2**31 - 1), E, "grad_L"),  # refused before any allocation
        (lambda: vjp.lu_unpack(z, None, 10**12, 3), E, "m"),  # past int32 row indices
        (lambda: vjp.lu_unpack(z, None, 3, 2**63), E, "n"),
        # vjp.lu_solve
        (lambda: vjp.lu_solve(np.zeros((3, 4)), piv, B, X, X), E, "LU"),
        (lambda: vjp.lu_solve(LU, piv, np.ones((4, 2)), X, X), E, "B"),
        (lambda: vjp.lu_solve(LU, piv, B, X, X, left=False), E, "B"),
        (lambda: vjp.lu_solve(LU, piv, B, X[:, :1], X), E, "X"),
        (lambda: vjp.lu_solve(LU, piv, B, X, X[None]), E, "grad_X"),
        (lambda: vjp.lu_solve(LU, piv, B, X, X.astype(complex)), D, "grad_X"),
        (lambda: vjp.lu_solve(np.zeros((2, 3, 3)), np.ones((2, 3), np.int32), np.ones((3, 3, 2)), X, X), E, "LU, B"),
        (lambda: vjp.lu_solve(LU, piv, B, X, X, adjoint=1), lu_core.InvalidInputError, "adjoint"),
        (lambda: vjp.lu_solve(LU, np.array([5, 2, 3]), B, X, X), lu_core.PivotError, "pivots"),
        # vjp.solve
        (lambda: vjp.solve(np.zeros((3, 4)), B, X, X), E, "A"),
        (lambda: vjp.solve(A, np.ones((4, 2)), X, X), E, "B"),
        (lambda: vjp.solve(A, np.float64(1.0), X, X), E, "B"),
        (lambda: vjp.solve(A, B, X.T, X), E, "X"),
        (lambda: vjp.solve(A, np.ones(3), np.ones((3, 1)), np.ones(3)), E, "X"),
        (lambda: vjp.solve(np.zeros((3, 3)), B, X, X), lu_core.SingularMatrixError, "singular"),
        (lambda: vjp.solve(A, B, X, X, left=None), lu_core.InvalidInputError, "left"),
        # jvp.lu_factor
        (lambda: jvp.lu_factor(np.zeros((3, 4)), LU, piv), E, "dA"),
        (lambda: jvp.lu_factor(c, LU, piv), D, "dA"),
        (lambda: jvp.lu_factor(z, LU, piv[None]), E, "pivots"),
        (lambda: jvp.lu_factor(z, LU[None, None, 0], piv), E, "LU"),
        # jvp.lu
        (lambda: jvp.lu(np.zeros((3, 4)), P, L, U), E, "dA"),
        (lambda: jvp.lu(z, None, L, U), E, "P"),
        (lambda: jvp.lu(z, P, L, U[:2]), E, "L, U"),
        (lambda: jvp.lu(c, P, L, U), D, "dA"),
        # jvp.lu_solve
        (lambda: jvp.lu_solve(LU, piv, X, np.zeros((2, 3, 3)), None), E, "dLU"),
        (lambda: jvp.lu_solve(LU, piv, X, None, np.ones((3, 3))), E, "dB"),
        (lambda: jvp.lu_solve(LU, piv, X, None, np.ones((2, 3, 2))), E, "dB"),
        (lambda: jvp.lu_solve(LU, piv, X, c, None), D, "dLU"),
        (lambda: jvp.lu_solve(LU, piv, np.ones((4, 2)), None, None), E, "X"),
        (lambda: jvp.lu_solve(np.zeros((2, 3, 3)), np.ones((2, 3), np.int32), X, None, None), E, "X"),
        # jvp.solve
        (lambda: jvp.solve(A, X, np.zeros((2, 3, 3)), None), E, "dA"),
        (lambda: jvp.solve(A, X, None, np.ones(3)), E, "dB"),
        (lambda: jvp.solve(A, np.ones(4), None, None), E, "X"),
        (lambda: jvp.solve(A, None, None, None), E, "X"),
        (lambda: jvp.solve(np.zeros((3, 3)), X, z, None), lu_core.SingularMatrixError, "singular"),
        (lambda: jvp.solve(np.zeros((2, 3, 3)), np.ones(3), None, None), E, "X"),
    ]


@pytest.mark.parametrize("case", range(len(_cases())))
def test_errors_name_the_argument(case):
    call, error, name = _cases()[case]
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, ValueError)
    assert name in str(info.value)


# ----------------------------------------------------------- both CPU paths


@pytest.mark.parametrize("path", ["kernel", "lapack"])
@pytest.mark.parametrize("shape", [(2, 45, 45), (50, 33), (33, 50)], ids=str)
def test_both_cpu_solver_paths(rng, shape, path):
    """The triangular solves go through the backend's lu_solve: Numba kernels or LAPACK."""
    A = random_matrix(rng, shape, np.complex128)
    LU, piv = lu_core.lu_factor(A)
    g, tA = random_matrix(rng, shape, np.complex128), random_matrix(rng, shape, np.complex128)
    with cpu_path(path):
        gA = vjp.lu_factor(LU, piv, g)
        dLU = jvp.lu_factor(tA, LU, piv)
    (fd,) = central(lambda h: (lu_core.lu_factor(A + h * tA)[0],))
    assert_rel(dLU, fd, 1e-5)
    assert inner(gA, tA) == pytest.approx(inner(g, dLU), rel=1e-9)
