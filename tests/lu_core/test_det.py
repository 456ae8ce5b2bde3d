"""slogdet and det against NumPy (and PyTorch where installed)."""

from __future__ import annotations

import numpy as np
import pytest

import lu_core
from tests.helpers import DTYPES, random_matrix

SHAPES = [(0, 0), (1, 1), (2, 2), (5, 5), (0, 3, 3), (2, 3, 6, 6), (2, 60, 60), (3, 0, 0)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_numpy(rng, dtype, shape):
    A = (random_matrix(rng, shape, dtype) / np.sqrt(max(1, shape[-1]))).astype(dtype)  # det within float32's range
    sign, logabsdet = lu_core.slogdet(A)
    want_sign, want_log = np.linalg.slogdet(A)
    real = np.finfo(np.dtype(dtype)).dtype
    assert sign.dtype == np.dtype(dtype) and sign.shape == shape[:-2]
    assert logabsdet.dtype == real and logabsdet.shape == shape[:-2]
    tol = 1e-4 if real == np.float32 else 1e-11
    np.testing.assert_allclose(sign, want_sign, atol=tol)
    np.testing.assert_allclose(logabsdet, want_log, atol=tol * max(1, shape[-1]))
    np.testing.assert_allclose(np.abs(sign[np.abs(sign) > 0]), 1, atol=tol)
    d = lu_core.det(A)
    assert d.dtype == np.dtype(dtype) and d.shape == shape[:-2]
    np.testing.assert_allclose(d, np.linalg.det(A), rtol=tol * max(1, shape[-1]))


def test_empty_matrix_is_one():
    sign, logabsdet = lu_core.slogdet(np.ones((0, 0)))
    assert sign == 1 and logabsdet == 0 and lu_core.det(np.ones((2, 0, 0))).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_singular(dtype):
    A = np.array([[[1, 2], [2, 4]], [[0, 0], [0, 0]], [[0, 1], [1, 0]]], dtype=dtype)
    sign, logabsdet = lu_core.slogdet(A)
    assert sign.tolist()[:2] == [0, 0] and sign[2] == -1
    assert np.isneginf(logabsdet[:2]).all() and logabsdet[2] == 0
    assert lu_core.det(A).tolist() == [0, 0, -1]


def test_complex_sign_has_unit_modulus(rng):
    A = np.diag([1j, 2.0, -3j]).astype(np.complex128)
    sign, logabsdet = lu_core.slogdet(A)
    np.testing.assert_allclose(sign, np.linalg.det(A) / abs(np.linalg.det(A)))
    np.testing.assert_allclose(logabsdet, np.log(6))
    np.testing.assert_allclose(lu_core.det(A), 6.0)


def test_slogdet_survives_where_det_overflows():
    A = np.eye(400) * 1e3
    sign, logabsdet = lu_core.slogdet(A)
    assert sign == 1 and np.isclose(logabsdet, 400 * np.log(1e3))
    assert np.isinf(lu_core.det(A))


def test_non_finite_propagates():
    A = np.array([[np.nan, 1.0], [1.0, 1.0]])
    sign, logabsdet = lu_core.slogdet(A)
    assert np.isnan(sign) and np.isnan(logabsdet) and np.isnan(lu_core.det(A))


def test_matches_torch(rng):
    torch = pytest.importorskip("torch")
    A = random_matrix(rng, (4, 6, 6), np.complex128)
    sign, logabsdet = lu_core.slogdet(A)
    t_sign, t_log = torch.linalg.slogdet(torch.from_numpy(A))
    np.testing.assert_allclose(sign, t_sign.numpy(), atol=1e-12)
    np.testing.assert_allclose(logabsdet, t_log.numpy(), atol=1e-12)
    np.testing.assert_allclose(lu_core.det(A), torch.linalg.det(torch.from_numpy(A)).numpy(), rtol=1e-12)


@pytest.mark.parametrize("fn", [lu_core.slogdet, lu_core.det])
@pytest.mark.parametrize(
    ("A", "error"),
    [
        (np.ones(3), lu_core.ShapeError),
        (np.ones((2, 3)), lu_core.ShapeError),
        (np.ones((2, 2), bool), lu_core.DTypeError),
        (np.array([["a", "b"], ["c", "d"]]), lu_core.DTypeError),
        (np.ones((2, 2), np.float16), lu_core.DTypeError),
    ],
)
def test_bad_arguments(fn, A, error):
    with pytest.raises(error) as excinfo:
        fn(A)
    assert excinfo.value.argument == "A" and isinstance(excinfo.value, ValueError)
