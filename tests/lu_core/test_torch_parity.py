"""PyTorch as an oracle: skipped where PyTorch is not installed (it is no
dependency of the project)."""

from __future__ import annotations

import numpy as np
import pytest

import lu_core
from tests.helpers import DTYPES, assert_close, cpu_path, random_matrix, well_conditioned

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("path", ["kernel", "lapack"])
@pytest.mark.parametrize("shape", [(6, 6), (3, 9, 9), (2, 7, 4), (2, 4, 7), (2, 70, 70)], ids=str)
def test_factor_pivots_equal_torch(rng, shape, path):
    A = rng.standard_normal(shape)
    LU_t, piv_t = torch.linalg.lu_factor(torch.from_numpy(A))
    with cpu_path(path):
        LU, piv = lu_core.lu_factor(A)
    np.testing.assert_array_equal(piv, piv_t.numpy())
    assert_close(LU, LU_t.numpy(), np.float64, max(shape[-2:]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0, 0), (5, 5), (2, 3, 6, 4), (2, 4, 6), (0, 3, 3)], ids=str)
def test_unpack_bit_identical_to_torch(rng, shape, dtype):
    A = torch.from_numpy(random_matrix(rng, shape, dtype))
    LU_t, piv_t = torch.linalg.lu_factor_ex(A)[:2]
    P_t, L_t, U_t = torch.lu_unpack(LU_t, piv_t)
    P, L, U = lu_core.lu_unpack(LU_t.numpy(), piv_t.numpy())
    for ours, theirs in [(P, P_t), (L, L_t), (U, U_t)]:
        assert ours.dtype == theirs.numpy().dtype
        np.testing.assert_array_equal(ours, theirs.numpy())


@pytest.mark.parametrize("adjoint", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_lu_solve_equals_torch(rng, dtype, left, adjoint):
    A = well_conditioned(rng, (2, 1, 5, 5), dtype)
    B = random_matrix(rng, (3, 5, 2) if left else (3, 2, 5), dtype)
    LU_t, piv_t = torch.linalg.lu_factor(torch.from_numpy(A))
    X_t = torch.linalg.lu_solve(LU_t, piv_t, torch.from_numpy(B), left=left, adjoint=adjoint)
    X = lu_core.lu_solve(LU_t.numpy(), piv_t.numpy(), B, left=left, adjoint=adjoint)
    assert_close(X, X_t.resolve_conj().numpy(), dtype, 5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_solve_equals_torch(rng, dtype):
    A = well_conditioned(rng, (4, 6, 6), dtype)
    B = random_matrix(rng, (4, 6), dtype)
    X_t = torch.linalg.solve(torch.from_numpy(A), torch.from_numpy(B))
    assert_close(lu_core.solve(A, B), X_t.numpy(), dtype, 6)


def test_torch_tensor_input_runs_on_cpu(rng):
    A = torch.from_numpy(rng.standard_normal((3, 4, 4)))
    LU, piv = lu_core.lu_factor(A)
    assert isinstance(LU, np.ndarray)
    np.testing.assert_array_equal(piv, torch.linalg.lu_factor(A)[1].numpy())


def test_tensors_that_require_grad_or_carry_a_conjugate_or_negation_bit_are_read_as_torch_reads_them(rng):
    """Their __array__ raises (RuntimeError, not a ValueError); lu_core reads their values instead."""
    A = torch.from_numpy(well_conditioned(rng, (2, 5, 5), np.complex128))
    for t in (A.clone().requires_grad_(True), A.conj(), torch._neg_view(A), A.conj().requires_grad_(True)):
        LU_t, piv_t = torch.linalg.lu_factor(t.detach())
        LU, piv = lu_core.lu_factor(t)
        np.testing.assert_array_equal(piv, piv_t.numpy())
        assert_close(LU, LU_t.numpy(), np.complex128, 5)
    with pytest.raises(lu_core.DTypeError, match="^A: cannot be read as an array"):
        lu_core.lu_factor(torch.eye(2, device="meta"))
