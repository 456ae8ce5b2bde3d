"""``lu_core.vjp`` / ``lu_core.jvp`` against ``torch.autograd.grad`` and ``torch.func.jvp``
on the CPU, for the same cotangents and tangents: all four dtypes, square, tall,
wide, batched, broadcast, ``left`` / ``adjoint``. Skipped where PyTorch is not
installed (it is no dependency of the project)."""

from __future__ import annotations

import numpy as np
import pytest

import lu_core
from lu_core import jvp, vjp
from tests.helpers import DTYPES, random_matrix, well_conditioned

torch = pytest.importorskip("torch")
from torch.func import jvp as torch_jvp  # noqa: E402 - after the importorskip

FACTOR_SHAPES = [(5, 5), (7, 4), (4, 7), (2, 3, 6, 6), (3, 6, 4), (2, 4, 6), (1, 1), (0, 3, 3)]
SOLVE_CASES = [((5, 5), (5, 2)), ((3, 4, 4), (3, 4, 1)), ((2, 1, 4, 4), (3, 4, 2)), ((4, 4), (2, 3, 4, 3))]


def rtol(dtype: type) -> float:
    return 2e-4 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-10


def close(ours: np.ndarray, theirs, dtype: type) -> None:
    theirs = theirs.detach().resolve_conj().numpy()
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (ours.shape, theirs.shape, ours.dtype)
    scale = max(1.0, float(np.max(np.abs(theirs), initial=0.0)))
    err = float(np.max(np.abs(ours - theirs), initial=0.0))
    assert err <= rtol(dtype) * scale, f"max error {err:.3e} (scale {scale:.3e})"


def factorable(rng, shape, dtype) -> np.ndarray:
    """Random matrices nudged towards a well-conditioned leading block, so float32 gradients are accurate."""
    a = random_matrix(rng, shape, dtype)
    m, n = shape[-2:]
    return (a + 2 * np.sqrt(max(m, n, 1)) * np.eye(m, n, dtype=dtype)[::-1]).astype(dtype)


def t(x: np.ndarray):
    return torch.from_numpy(np.ascontiguousarray(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", FACTOR_SHAPES, ids=str)
def test_lu_factor(rng, shape, dtype):
    A = factorable(rng, shape, dtype)
    A_t = t(A).requires_grad_()
    LU_t, piv_t = torch.linalg.lu_factor(A_t)
    g = random_matrix(rng, shape, dtype)
    (gA_t,) = torch.autograd.grad(LU_t, A_t, t(g))
    LU, piv = LU_t.detach().numpy(), piv_t.numpy()
    close(vjp.lu_factor(LU, piv, g), gA_t, dtype)
    dA = random_matrix(rng, shape, dtype)
    _, dLU_t = torch_jvp(lambda a: torch.linalg.lu_factor(a)[0], (t(A),), (t(dA),))
    close(jvp.lu_factor(dA, LU, piv), dLU_t, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", FACTOR_SHAPES, ids=str)
def test_lu(rng, shape, dtype):
    A = factorable(rng, shape, dtype)
    A_t = t(A).requires_grad_()
    P_t, L_t, U_t = torch.linalg.lu(A_t)
    gL, gU = random_matrix(rng, tuple(L_t.shape), dtype), random_matrix(rng, tuple(U_t.shape), dtype)
    (gA_t,) = torch.autograd.grad((L_t, U_t), A_t, (t(gL), t(gU)), retain_graph=True)
    P, L, U = (x.detach().numpy() for x in (P_t, L_t, U_t))
    close(vjp.lu(P, L, U, gL, gU), gA_t, dtype)
    (gA_U_t,) = torch.autograd.grad(U_t, A_t, t(gU))
    close(vjp.lu(P, L, U, None, gU), gA_U_t, dtype)
    dA = random_matrix(rng, shape, dtype)
    _, (dL_t, dU_t) = torch_jvp(lambda a: torch.linalg.lu(a)[1:], (t(A),), (t(dA),))
    dL, dU = jvp.lu(dA, P, L, U)
    close(dL, dL_t, dtype)
    close(dU, dU_t, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", FACTOR_SHAPES, ids=str)
def test_lu_unpack(rng, shape, dtype):
    m, n = shape[-2:]
    LU_t, piv_t = torch.linalg.lu_factor(t(factorable(rng, shape, dtype)))
    LU_t.requires_grad_()
    _, L_t, U_t = torch.lu_unpack(LU_t, piv_t)
    gL, gU = random_matrix(rng, tuple(L_t.shape), dtype), random_matrix(rng, tuple(U_t.shape), dtype)
    (gLU_t,) = torch.autograd.grad((L_t, U_t), LU_t, (t(gL), t(gU)))
    close(vjp.lu_unpack(gL, gU, m, n), gLU_t, dtype)


@pytest.mark.parametrize("adjoint", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("lu_shape", "b_shape"), SOLVE_CASES, ids=str)
def test_lu_solve(rng, lu_shape, b_shape, dtype, left, adjoint):
    A = well_conditioned(rng, lu_shape, dtype)
    B = random_matrix(rng, b_shape if left else (*b_shape[:-2], b_shape[-1], b_shape[-2]), dtype)
    LU_t, piv_t = torch.linalg.lu_factor(t(A))
    LU_t.requires_grad_()
    B_t = t(B).requires_grad_()
    X_t = torch.linalg.lu_solve(LU_t, piv_t, B_t, left=left, adjoint=adjoint)
    gX = random_matrix(rng, tuple(X_t.shape), dtype)
    gLU_t, gB_t = torch.autograd.grad(X_t, (LU_t, B_t), t(gX))
    LU, piv, X = LU_t.detach().numpy(), piv_t.numpy(), X_t.detach().resolve_conj().numpy()
    gLU, gB = vjp.lu_solve(LU, piv, B, X, gX, left=left, adjoint=adjoint)
    close(gLU, gLU_t, dtype)
    close(gB, gB_t, dtype)
    dLU, dB = random_matrix(rng, LU.shape, dtype), random_matrix(rng, B.shape, dtype)
    _, dX_t = torch_jvp(
        lambda lu, b: torch.linalg.lu_solve(lu, piv_t, b, left=left, adjoint=adjoint),
        (LU_t.detach(), t(B)),
        (t(dLU), t(dB)),
    )
    close(jvp.lu_solve(LU, piv, X, dLU, dB, left=left, adjoint=adjoint), dX_t, dtype)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("a_shape", "b_shape"), [*SOLVE_CASES, ((4, 4), (4,)), ((3, 4, 4), (3, 4)), ((3, 4, 4), (4,))], ids=str
)
def test_solve(rng, a_shape, b_shape, dtype, left):
    vector = len(b_shape) == 1 or b_shape == a_shape[:-1]
    if vector and not left:
        pytest.skip("torch.linalg.solve refuses a vector B with left=False")
    A = well_conditioned(rng, a_shape, dtype)
    B = random_matrix(rng, b_shape if left else (*b_shape[:-2], b_shape[-1], b_shape[-2]), dtype)
    A_t, B_t = t(A).requires_grad_(), t(B).requires_grad_()
    X_t = torch.linalg.solve(A_t, B_t, left=left)
    gX = random_matrix(rng, tuple(X_t.shape), dtype)
    gA_t, gB_t = torch.autograd.grad(X_t, (A_t, B_t), t(gX))
    X = X_t.detach().resolve_conj().numpy()
    gA, gB = vjp.solve(A, B, X, gX, left=left)
    close(gA, gA_t, dtype)
    close(gB, gB_t, dtype)
    dA, dB = random_matrix(rng, A.shape, dtype), random_matrix(rng, B.shape, dtype)
    _, dX_t = torch_jvp(lambda a, b: torch.linalg.solve(a, b, left=left), (t(A), t(B)), (t(dA), t(dB)))
    close(jvp.solve(A, X, dA, dB, left=left), dX_t, dtype)


def test_lu_factor_on_torch_tensors_directly(rng):
    """CPU tensors are read through ``__array__``, like every ``lu_core`` function."""
    A_t = torch.from_numpy(factorable(rng, (3, 4, 4), np.float64)).requires_grad_()
    LU_t, piv_t = torch.linalg.lu_factor(A_t)
    g = torch.from_numpy(random_matrix(rng, (3, 4, 4), np.float64))
    (gA_t,) = torch.autograd.grad(LU_t, A_t, g)
    close(vjp.lu_factor(LU_t.detach(), piv_t, g), gA_t, np.float64)


def test_lu_solve_singular_gives_non_finite_like_torch():
    LU_t = torch.tensor([[1.0, 2.0], [0.5, 0.0]], dtype=torch.float64, requires_grad=True)
    piv_t = torch.tensor([1, 2], dtype=torch.int32)
    B = torch.ones(2, 1, dtype=torch.float64)
    X_t = torch.linalg.lu_solve(LU_t, piv_t, B)
    (gLU_t,) = torch.autograd.grad(X_t, LU_t, torch.ones_like(X_t))
    gLU, _ = vjp.lu_solve(LU_t.detach().numpy(), piv_t.numpy(), B.numpy(), X_t.detach().numpy(), np.ones((2, 1)))
    assert np.isfinite(gLU).all() == bool(torch.isfinite(gLU_t).all())
    assert lu_core.lu_solve is not None
