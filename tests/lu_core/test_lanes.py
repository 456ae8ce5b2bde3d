"""The SIMD-lane factorization (``lu_core._cpu._lanes``) gives the per-matrix kernel's bits.

Every matrix of a batch, whichever group and lane it lands in (or the tail the
groups leave), must get exactly what ``_kernels._getf2`` gives it alone: LU,
pivots and info, byte for byte, also where the scalar kernel takes a special
branch (a zero, NaN, infinite or subnormal pivot, a zero multiplier, ties in
the pivot search) in one lane while its neighbours do not.
"""

from __future__ import annotations

import numpy as np
import pytest

import lu_core
from lu_core._cpu import _kernels, _lanes, _tuning, backend

REAL = [np.float32, np.float64]


def _factor(kernel, a: np.ndarray, transposed: bool, pivot: bool) -> tuple[np.ndarray, ...]:
    """``kernel`` (``_kernels._getrf``'s arguments) on ``a`` from either kind of source, into outputs
    filled with -7, so that a matrix the kernel skipped shows."""
    nb, m, n = a.shape
    src = a if transposed else np.ascontiguousarray(a.swapaxes(1, 2))
    s = np.full((nb, n, m), -7, a.dtype)
    piv = np.full((nb, min(m, n)), -7, np.int32)
    info = np.full(nb, -7, np.int32)
    kernel(src, transposed, s, piv, info, pivot)
    return s, piv, info


def _special(rng: np.random.Generator, nb: int, m: int, n: int, dtype) -> np.ndarray:
    """Random matrices with one special case every few matrices, so that groups mix them with ordinary lanes."""
    a = rng.standard_normal((nb, m, n)).astype(dtype)
    tiny = np.finfo(dtype).tiny
    for b in range(0, nb, 3):
        case = (b // 3) % 11
        x = a[b]
        if case == 0:
            x[:] = 0  # zero pivots from the first step: info 1
        elif case == 1:
            x[:, 0] = 0  # a zero first column: info 1, the rest still eliminated
        elif case == 2:
            x[0, 0] = np.nan
        elif case == 3:
            x[-1, 0] = np.inf
        elif case == 4:
            x *= tiny / 4  # subnormal pivots: divided, not scaled by an overflowing reciprocal
        elif case == 5:
            x[:, 0] = 1.0  # ties: the first row of the largest magnitude wins
            x[-1, 0] = -1.0
        elif case == 6 and m > 1:
            x[1] = x[0]  # rank-deficient: a zero pivot later on
        elif case == 7:
            x[0, 0] = -0.0
            x[:, min(1, n - 1)] = 0  # zero multipliers skip their updates
        elif case == 8:
            x[:] = np.round(x)  # many exact ties and exact zeros
        elif case == 9 and m > 1:
            # Row 0 the first pivot, a NaN below it (a NaN multiplier), and zeros in the rest of row 0:
            # every update of step 0 multiplies that NaN by a zero multiplier, which must be skipped.
            x[0, 0] = 100.0
            x[-1, 0] = np.nan
            x[0, 1:] = 0
        elif case == 10 and m > 2:
            x[:, 0] = 0.5  # a tie below the diagonal beating it: the first of the two rows wins
            x[1, 0] = 3.0
            x[2, 0] = -3.0
    return a


def _same(x: tuple[np.ndarray, ...], y: tuple[np.ndarray, ...]) -> bool:
    return all(u.tobytes() == v.tobytes() for u, v in zip(x, y, strict=True))


@pytest.mark.parametrize("dtype", REAL)
@pytest.mark.parametrize("shape", [(8, 8), (16, 16), (5, 7), (7, 5), (1, 6), (6, 1), (1, 1), (3, 3), (12, 16), (16, 9)])
@pytest.mark.parametrize("transposed", [True, False])
def test_lanes_give_the_bits_of_one_matrix_at_a_time(rng, dtype, shape, transposed):
    m, n = shape
    nb = 45 * _lanes.LANES  # every case in every lane (11 cases, one every 3 matrices)
    a = _special(rng, nb, m, n, dtype)
    for pivot in (True, False):
        ref = _factor(_kernels.getrf.serial, a, transposed, pivot)
        for twin in (_lanes.getrf.serial, _lanes.getrf.parallel):
            got = _factor(twin, a, transposed, pivot)
            assert _same(got, ref), f"{np.dtype(dtype).name} {shape} pivot={pivot} differs from the per-matrix kernel"
    assert (ref[2] > 0).any(), "the special cases must include singular matrices"


@pytest.mark.parametrize("nb", [0, 1, _lanes.LANES - 1, _lanes.LANES, _lanes.LANES + 1, 5 * _lanes.LANES + 3])
@pytest.mark.parametrize("size", [8, _tuning.LANES_MAX_N, _tuning.LANES_MAX_N + 1])
def test_the_backend_gives_whole_groups_to_the_lanes_and_the_rest_one_by_one(rng, monkeypatch, nb, size):
    a = _special(rng, nb, size, size, np.float64)
    ref = _factor(_kernels.getrf.serial, a, True, True)
    calls = []
    for module in (_lanes, _kernels):
        twin = module.getrf
        monkeypatch.setattr(
            module,
            "getrf",
            lambda work, src, *rest, _t=twin, _m=module: (calls.append((_m, src.shape[0])), _t(work, src, *rest)),
        )
    assert _same(_factor(backend._kernel_factor, a, True, True), ref)
    whole = nb - nb % _lanes.LANES if size <= _tuning.LANES_MAX_N else 0
    expected = ([(_lanes, whole)] if whole else []) + ([(_kernels, nb - whole)] if nb > whole else [])
    assert calls == expected


def test_a_partial_group_is_refused(rng):
    a = _special(rng, _lanes.LANES + 1, 4, 4, np.float64)
    with pytest.raises(ValueError, match="whole groups"):
        _factor(_lanes.getrf.serial, a, True, True)


def test_complex_matrices_are_not_given_to_the_lanes(rng, monkeypatch):
    monkeypatch.setattr(_lanes, "getrf", None)  # would raise if called
    a = (rng.standard_normal((16, 8, 8)) + 1j * rng.standard_normal((16, 8, 8))).astype(np.complex128)
    assert _same(_factor(backend._kernel_factor, a, True, True), _factor(_kernels.getrf.serial, a, True, True))


@pytest.mark.parametrize("dtype", REAL)
def test_public_lu_factor_by_lanes_matches_each_matrix_alone(rng, dtype):
    """Through the public API: the direct path (NumPy arrays), the backend's general one, and matrices
    stored column-major (the other kind of source)."""
    a = _special(rng, 3 * _lanes.LANES + 2, 8, 8, dtype)
    LU, piv, info = lu_core.lu_factor_ex(a)
    LU_g, piv_g, info_g = backend.CPU_BACKEND.lu_factor_ex(a, True)
    LU_t, piv_t, info_t = lu_core.lu_factor_ex(a.swapaxes(1, 2).copy().swapaxes(1, 2))
    for i in range(a.shape[0]):
        LU1, piv1, info1 = lu_core.lu_factor_ex(a[i])
        one = LU1.tobytes()
        assert one == np.ascontiguousarray(LU[i]).tobytes() == np.ascontiguousarray(LU_t[i]).tobytes()
        assert one == np.ascontiguousarray(LU_g[i]).tobytes()
        assert piv1.tobytes() == piv[i].tobytes() == piv_t[i].tobytes() == piv_g[i].tobytes()
        assert int(info1) == int(info[i]) == int(info_t[i]) == int(info_g[i])
    P, L, U = lu_core.lu_unpack(LU, piv)
    ok = info == 0
    ok &= np.isfinite(a).all(axis=(1, 2))
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(P[ok] @ L[ok] @ U[ok], a[ok], rtol=tol, atol=tol)
