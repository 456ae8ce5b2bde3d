"""GPU backend against the CPU backend: same results, same errors, on every GPU path.

Marked ``gpu``: skipped where CuPy or a CUDA device is missing (conftest). The
shapes reach every dispatch branch (see lu_core/_gpu/_factor.py, _solve.py):
the small-matrix kernels (n <= 32, both sides of the boundary), cuBLAS
``getrfBatched`` / ``trsmBatched``, cuSOLVER ``getrf`` / ``getrs``, the fused
right-hand-side gather and the pivot=False refactor; cuBLAS ``getrsBatched``,
which the H100's calibration took out of the dispatch, with the table forced."""

from __future__ import annotations

import math

import numpy as np
import pytest

import lu_core
from tests.helpers import DTYPES, FACTOR_SHAPES, assert_close, random_matrix, well_conditioned

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

DOUBLE = (np.float64, np.complex128)
BOUNDARY_SHAPES = [(5, 31, 31), (5, 32, 32), (5, 33, 33), (3, 32, 20), (3, 20, 32), (2, 33, 5), (4, 1, 32)]
# Rectangular matrices our kernel takes (rows wrap around the lanes; shared memory (m | 1) x n x item size:
# complex128 64 x 48 and 64 x 49 need the opt-in above 48 KiB; 127 x 96 is 48 KiB in float32, 95 KiB in
# float64 and complex64 (opted in), 190 KiB in complex128: cuSOLVER), alone and in batches, and ones too
# large for it.
RECTANGULAR_SHAPES = [
    (40, 100, 20), (6, 20, 100), (5, 64, 48), (5, 64, 49), (1, 64, 49), (6, 127, 96), (1, 127, 96), (2, 300, 100),
    (2, 100, 300),
]  # fmt: skip
LIBRARY_SHAPES = [(64, 40, 40), (3, 200, 200), (1, 300, 300), (3, 40, 70), (2, 70, 40)]


def _own_kernel(shape, dtype) -> bool:
    from lu_core._gpu import _tuning
    from lu_core._gpu._factor import _device_optin

    return _tuning.own_kernel(*shape[-2:], np.dtype(dtype), _device_optin)


def _factor_path(shape, dtype) -> str:
    from lu_core._gpu import _tuning
    from lu_core._gpu._factor import _device_optin

    return _tuning.factor_path(*shape[-2:], math.prod(shape[:-2]), np.dtype(dtype), _device_optin)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape", [*FACTOR_SHAPES, *BOUNDARY_SHAPES, *RECTANGULAR_SHAPES, *LIBRARY_SHAPES, (3000, 8, 8)], ids=str
)
def test_factor_and_unpack(rng, shape, dtype):
    A = random_matrix(rng, shape, dtype)
    LU_g, piv_g, info_g = lu_core.lu_factor_ex(cp.asarray(A))
    assert isinstance(LU_g, cp.ndarray) and LU_g.shape == A.shape and LU_g.dtype == A.dtype
    m, n = shape[-2:]
    P, L, U = (cp.asnumpy(x) for x in lu_core.lu_unpack(LU_g, piv_g))
    assert_close(P @ L @ U, A, dtype, max(m, n))
    LU_c, piv_c, info_c = lu_core.lu_factor_ex(A)
    np.testing.assert_array_equal(cp.asnumpy(info_g), info_c)
    # LAPACK's pivots where the routine uses LAPACK's measure: our kernel (all dtypes' |re|+|im|),
    # cuSOLVER and real cuBLAS; complex getrfBatched does not (the H100's calibration: another
    # measure, 0 of 80 random matrices per dtype matched), so there only P @ L @ U == A (above).
    if np.dtype(dtype) in (np.float64, np.complex128) and (
        _own_kernel(shape, dtype) or dtype == np.float64 or _factor_path(shape, dtype) == "getrf"
    ):
        np.testing.assert_array_equal(cp.asnumpy(piv_g), piv_c)
        assert_close(cp.asnumpy(LU_g), LU_c, dtype, max(m, n))


@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
@pytest.mark.parametrize("shape", [(40, 8, 8), (7, 40, 8), (5, 6, 33), (1, 5, 5), (6, 1, 7)], ids=str)
@pytest.mark.parametrize("pivot", [True, False])
def test_factor_reads_a_in_any_layout(rng, shape, dtype, pivot, monkeypatch):
    """Our kernel reads a C-ordered or column-major A where it is (no transposed copy first) and
    anything else through a copy: the same factorization either way, the input untouched."""
    from lu_core._gpu import _factor

    nb, m = shape[0], shape[1]
    A = random_matrix(rng, shape, dtype)
    big = cp.asarray(random_matrix(rng, (nb, 2 * m, 2 * shape[2]), dtype))
    big[:, ::2, ::2] = cp.asarray(A)
    layouts = {  # the layout, and how the kernel is to read it: row-major, column-major, or a copy (None)
        "C": (cp.asarray(A), True),
        # (cp.asarray of a NumPy (1, m, n) view keeps its order, and NumPy calls a transposed one
        # F-ordered: it would come back C-contiguous; a device-side copy is unambiguous)
        "column-major": (cp.ascontiguousarray(cp.asarray(A).swapaxes(-1, -2)).swapaxes(-1, -2), m == 1),
        "Fortran": (cp.asfortranarray(cp.asarray(A)), None if nb > 1 else False),
        "strided": (big[:, ::2, ::2], None),
        "broadcast": (cp.broadcast_to(cp.asarray(A[:1]), shape), None if nb > 1 else True),
    }
    seen = []
    real = _factor._small

    def small(s, piv, info, m, n, pivot, src=None, src_rowmajor=False):
        seen.append(None if src is None else src_rowmajor)
        return real(s, piv, info, m, n, pivot, src=src, src_rowmajor=src_rowmajor)

    monkeypatch.setattr(_factor, "_small", small)
    for name, (a, how) in layouts.items():
        before = cp.asnumpy(a)
        copied = cp.asarray(np.pad(before, ((0, 0), (0, 0), (0, 1))))[..., :-1]  # strided: the copy path
        want = [cp.asnumpy(x) for x in lu_core.lu_factor_ex(copied, pivot=pivot)]
        assert seen[-1:] == [None]
        seen.clear()
        got = [cp.asnumpy(x) for x in lu_core.lu_factor_ex(a, pivot=pivot)]
        assert seen[-1:] == [how], name
        np.testing.assert_array_equal(cp.asnumpy(a), before)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 3), (16, 16), (32, 32), (100, 20), (20, 90), (64, 33)], ids=str)
def test_small_kernel_ties_follow_lapack(shape, dtype, monkeypatch):
    """Integer entries make many equal magnitudes: the first one wins, as in LAPACK.

    The first step's ties are exact on any device (with more than 32 rows, they wrap
    around the warp's lanes). Later ones depend on rounding: the small kernel rounds
    like the CPU kernels (no FMA), so for real dtypes up to 32 x 32 (where the CPU
    runs its own getf2-order kernel too) all pivots must agree; complex division may
    round differently in the last bit, and larger CPU factorizations may be blocked,
    so elsewhere only the first step is compared exactly."""
    from lu_core._gpu import _tuning

    monkeypatch.setattr(_tuning, "SMALL_FACTOR_MAX_N", 32)  # our kernel, whatever the calibration chose
    monkeypatch.setattr(_tuning, "RECT_FACTOR_MAX_BYTES", 96 * 1024)
    m, n = shape
    A = np.random.default_rng(m * n).integers(-2, 3, size=(200, m, n)).astype(dtype)
    if np.dtype(dtype).kind == "c":
        A = A + 1j * np.random.default_rng(m * n + 1).integers(-2, 3, size=A.shape)
        A = A.astype(dtype)
    assert _own_kernel(A.shape, dtype)
    LU_g, piv_g, info_g = lu_core.lu_factor_ex(cp.asarray(A))
    LU_c, piv_c, info_c = lu_core.lu_factor_ex(A)
    piv_g = cp.asnumpy(piv_g)
    np.testing.assert_array_equal(piv_g[:, 0], piv_c[:, 0])
    if np.dtype(dtype).kind == "f" and max(m, n) <= 32:
        np.testing.assert_array_equal(piv_g, piv_c)
        np.testing.assert_array_equal(cp.asnumpy(info_g), info_c)
        assert_close(cp.asnumpy(LU_g), LU_c, dtype, n, scale=max(1.0, float(np.abs(LU_c).max())))
    P, L, U = (cp.asnumpy(x) for x in lu_core.lu_unpack(LU_g, cp.asarray(piv_g)))
    assert_close(P @ L @ U, A, dtype, max(m, n), scale=max(1.0, float(np.abs(A).max())))


@pytest.mark.parametrize("dtype", DTYPES)
def test_non_finite_input_keeps_pivots_in_range(dtype):
    A = random_matrix(np.random.default_rng(5), (6, 12, 12), dtype)
    A[0, 3, 0] = np.nan
    A[1, 0, 0] = np.nan
    A[2, 5, 2] = np.inf
    _, piv_g, _ = lu_core.lu_factor_ex(cp.asarray(A))
    _, piv_c, _ = lu_core.lu_factor_ex(A)
    piv = cp.asnumpy(piv_g)
    assert piv.min() >= 1 and piv.max() <= 12
    np.testing.assert_array_equal(piv, piv_c)


@pytest.mark.parametrize("dtype", DTYPES)
def test_unpack_bit_identical_to_cpu(rng, dtype):
    LU = random_matrix(rng, (4, 7, 5), dtype)
    piv = np.maximum(rng.integers(1, 8, size=(4, 5)), np.arange(1, 6))
    for layout in (LU, np.ascontiguousarray(LU.swapaxes(-1, -2)).swapaxes(-1, -2)):
        cpu = lu_core.lu_unpack(layout, piv)
        gpu = lu_core.lu_unpack(cp.asarray(layout), cp.asarray(piv))
        for c, g in zip(cpu, gpu, strict=True):
            np.testing.assert_array_equal(cp.asnumpy(g), c)


@pytest.mark.parametrize("nrhs", [1, 2, 3, 80])
@pytest.mark.parametrize("adjoint", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("lu_batch", "b_batch", "n"),
    [
        ((), (), 5),  # small kernel, one problem
        ((2, 1), (3,), 6),  # small kernel, broadcast both ways
        ((), (50,), 32),  # small kernel at its limit, broadcast LU
        ((), (), 33),  # cuSOLVER getrs (one problem)
        ((4,), (4,), 40),  # trsmBatched (getrsBatched where _tuning chooses it: below)
        ((1,), (7,), 100),  # broadcast LU on the cuBLAS paths
        ((2,), (2,), 150),  # trsmBatched, a larger n
        ((600,), (600,), 5),  # B's offsets computed on the device (over 512 problems): one term
        ((1, 30), (40, 1), 4),  # the same, broadcast both ways (1200 problems)
        ((3, 1), (3, 200), 40),  # device offsets on the cuBLAS paths
    ],
    ids=str,
)
def test_solve(rng, lu_batch, b_batch, n, dtype, left, adjoint, nrhs):
    A = well_conditioned(rng, (*lu_batch, n, n), dtype)
    B = random_matrix(rng, (*b_batch, n, nrhs) if left else (*b_batch, nrhs, n), dtype)
    LU, piv = lu_core.lu_factor(cp.asarray(A))
    X = cp.asnumpy(lu_core.lu_solve(LU, piv, cp.asarray(B), left=left, adjoint=adjoint))
    X_cpu = lu_core.lu_solve(*lu_core.lu_factor(A), B, left=left, adjoint=adjoint)
    assert_close(X, X_cpu, dtype, n, scale=max(1.0, float(np.abs(X_cpu).max())))


@pytest.mark.parametrize("nrhs", [1, 3])
@pytest.mark.parametrize("adjoint", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("lu_batch", "b_batch", "n"), [((4,), (4,), 40), ((1,), (7,), 100), ((3, 1), (3, 200), 40)], ids=str
)
def test_solve_through_getrs_batched(rng, lu_batch, b_batch, n, dtype, left, adjoint, nrhs, monkeypatch):
    """cuBLAS getrsBatched, which the H100's calibration took out of the dispatch (GETRS_BATCHED_MAX_N = 0):
    still right where a table chooses it."""
    from lu_core._gpu import _solve, _tuning

    monkeypatch.setattr(_tuning, "GETRS_BATCHED_MAX_N", 1 << 30)
    monkeypatch.setattr(_tuning, "GETRS_BATCHED_MAX_NRHS", 1 << 30)
    chosen = []
    real = _solve._getrs_batched
    monkeypatch.setattr(_solve, "_getrs_batched", lambda *a: chosen.append(1) or real(*a))
    A = well_conditioned(rng, (*lu_batch, n, n), dtype)
    B = random_matrix(rng, (*b_batch, n, nrhs) if left else (*b_batch, nrhs, n), dtype)
    LU, piv = lu_core.lu_factor(cp.asarray(A))
    X = cp.asnumpy(lu_core.lu_solve(LU, piv, cp.asarray(B), left=left, adjoint=adjoint))
    assert chosen == [1]
    X_cpu = lu_core.lu_solve(*lu_core.lu_factor(A), B, left=left, adjoint=adjoint)
    assert_close(X, X_cpu, dtype, n, scale=max(1.0, float(np.abs(X_cpu).max())))


@pytest.mark.parametrize("n", [8, 64])
@pytest.mark.parametrize("dtype", DTYPES)
def test_solve_reads_strided_and_broadcast_b(rng, n, dtype):
    A = well_conditioned(rng, (3, n, n), dtype)
    base = random_matrix(rng, (2, 5, n, 2 * n), dtype)
    column_major = random_matrix(rng, (3, 4, n), dtype).swapaxes(-1, -2)
    for B in (base[0, :3, :, ::2], base[1, :1, :, 1::2], column_major, base[0, 0, :, :4][None]):
        X = cp.asnumpy(lu_core.lu_solve(*lu_core.lu_factor(cp.asarray(A)), cp.asarray(B)))
        X_cpu = lu_core.lu_solve(*lu_core.lu_factor(A), B)
        assert_close(X, X_cpu, dtype, n, scale=max(1.0, float(np.abs(X_cpu).max())))


@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
def test_solve_reads_strided_broadcast_b_of_many_problems(rng, dtype):
    """Over 512 problems: B's offsets computed on the device, from two to four terms (reversed,
    strided, broadcast), and on the host where a view needs five."""
    from lu_core._gpu._broadcast import element_strides, offset_terms

    n = 4
    base = random_matrix(rng, (3, 80, 12, n, 2), dtype)
    five = random_matrix(rng, (4, 3, 4, 3, 4, n, 2), dtype)[:, ::-1, :, ::-1]  # no neighbours merge
    cases = [  # (A's batch, B, B's terms)
        ((3, 1, 1), base[::-1, ::-2, 1::2], 2),  # 3 x 40 x 6 problems, the reversed pair merged
        ((3, 1, 1), base[:, None, ::3, :], 3),  # 3 x 3 x 27 x 12, B broadcast in its second dimension
        ((3, 1), five, 5),  # 576 problems, on the host
    ]
    for a_batch, B, count in cases:
        out_batch = np.broadcast_shapes(a_batch, B.shape[:-2])
        assert np.prod(out_batch) > 512
        strides = element_strides(B.strides, B.itemsize)[:-2]
        assert len(offset_terms(B.shape[:-2], strides, out_batch)) == count
        A = well_conditioned(rng, (*a_batch, n, n), dtype)
        X = cp.asnumpy(lu_core.lu_solve(*lu_core.lu_factor(cp.asarray(A)), cp.asarray(B)))
        X_cpu = lu_core.lu_solve(*lu_core.lu_factor(A), B)
        assert_close(X, X_cpu, dtype, n, scale=max(1.0, float(np.abs(X_cpu).max())))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 6, 6), (3, 40, 40), (1, 70, 70), (2, 40, 60)], ids=str)
def test_solve_and_lu_use_own_pivots(rng, shape, dtype):
    A = well_conditioned(rng, shape, dtype) if shape[-1] == shape[-2] else random_matrix(rng, shape, dtype)
    P, L, U = (cp.asnumpy(x) for x in lu_core.lu(cp.asarray(A)))
    assert_close(P @ L @ U, A, dtype, max(shape[-2:]))
    if shape[-1] == shape[-2]:
        B = random_matrix(rng, (*shape[:-1], 3), dtype)
        X = cp.asnumpy(lu_core.solve(cp.asarray(A), cp.asarray(B)))
        assert_close(X, lu_core.solve(A, B), dtype, shape[-1], scale=max(1.0, float(np.abs(X).max())))


@pytest.mark.parametrize("bad", [0, 9, -1])
def test_bad_pivots_raise_on_the_gpu(bad):
    piv = cp.asarray(np.array([[1, 2, 3], [2, bad, 3]], dtype=np.int64))
    LU = cp.eye(3)[None].repeat(2, axis=0)
    with pytest.raises(lu_core.PivotError, match=r"index \(1, 1\)"):
        lu_core.lu_unpack(LU, piv)
    with pytest.raises(lu_core.PivotError):
        lu_core.lu_solve(LU, piv, cp.ones((2, 3, 1)))
    with pytest.raises(lu_core.PivotError):
        lu_core.pivots_to_permutation(piv, 3)


def _general_path(monkeypatch):
    """The API's general path for lu_solve on the GPU: check_pivots, then the backend's solve."""
    from lu_core._gpu.backend import GpuBackend

    monkeypatch.setattr(GpuBackend, "solve_direct", lambda self, *a: None)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("batch", "n", "nrhs"),
    [
        ((), 8, 1),
        ((5,), 5, 4),
        ((), 32, 3),
        ((2, 3), 7, 2),
        ((600,), 4, 1),
        ((), 33, 1),
        ((1,), 100, 3),
        ((1, 1), 64, 1),
        ((5,), 40, 2),
        ((2, 3), 64, 1),
    ],
)
def test_the_direct_solve_gives_the_general_paths_bits(rng, batch, n, nrhs, dtype, monkeypatch):
    """``lu_solve`` with the default options on what ``lu_factor`` returns takes ``_solve.solve_direct``
    (our kernel reading the user's pivots and B where they are; past n = 32, one problem: cuSOLVER
    ``getrs`` on a checked copy of the pivots; more: cuBLAS's batched paths, the pivots' flag read
    after the solve): the general path's bits (the same kernels or library calls after ``check_pivots``),
    for contiguous, strided and column-major right-hand sides."""
    from lu_core._gpu import _solve

    A = well_conditioned(rng, (*batch, n, n), dtype)
    LU, piv = lu_core.lu_factor(cp.asarray(A))
    wide = cp.asarray(random_matrix(rng, (*batch, n, 2 * nrhs), dtype))
    column_major = cp.asarray(random_matrix(rng, (*batch, nrhs, n), dtype)).swapaxes(-1, -2)
    taken = []
    real = _solve.solve_direct
    for B in (cp.ascontiguousarray(wide[..., :nrhs]), wide[..., ::2], column_major):
        with monkeypatch.context() as m:
            m.setattr(_solve, "solve_direct", lambda *a: taken.append(real(*a)) or taken[-1])
            X = lu_core.lu_solve(LU, piv, B)
        with monkeypatch.context() as m:
            _general_path(m)
            want = lu_core.lu_solve(LU, piv, B)
        assert X.shape == want.shape and X.strides == want.strides
        np.testing.assert_array_equal(cp.asnumpy(X).view(np.uint8), cp.asnumpy(want).view(np.uint8))
        X_cpu = lu_core.lu_solve(*lu_core.lu_factor(A), cp.asnumpy(B))
        assert_close(cp.asnumpy(X), X_cpu, dtype, n, scale=max(1.0, float(np.abs(X_cpu).max())))
    assert len(taken) == 3 and all(x is not None for x in taken)  # the direct path answered each


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize(
    ("a_batch", "b_batch", "n", "nrhs"),
    [
        ((), (), 8, 1),
        ((4,), (4,), 5, 3),
        ((2, 1), (3,), 32, 2),
        ((1,), (700,), 3, 1),
        ((), (), 100, 2),
        ((1,), (), 40, 2),
        ((), (1,), 64, 3),
    ],
)
def test_solve_fused_gives_the_general_paths_bits(rng, a_batch, b_batch, n, nrhs, dtype, left, monkeypatch):
    """``solve`` of systems our kernels factor and solve (n <= 32) takes ``_solve.solve_fused``: small_getrf
    then small_getrs on its 1-based pivots, B read where it is (broadcast both ways, over 512 problems
    too); so does one system past n = 32 (lu_factor_ex, then cuSOLVER getrs on getrf's pivots): the bits of
    the general path (lu_factor_ex, own_pivots, lu_solve), and its singular check."""
    from lu_core._gpu import _solve
    from lu_core._gpu.backend import GpuBackend

    A = cp.asarray(well_conditioned(rng, (*a_batch, n, n), dtype))
    B = cp.asarray(random_matrix(rng, (*b_batch, n, nrhs) if left else (*b_batch, nrhs, n), dtype))
    taken = []
    real = _solve.solve_fused
    with monkeypatch.context() as m:
        m.setattr(_solve, "solve_fused", lambda *a: taken.append(real(*a)) or taken[-1])
        X = lu_core.solve(A, B, left=left)
    with monkeypatch.context() as m:
        m.setattr(GpuBackend, "solve_fused", lambda self, *a: None)
        want = lu_core.solve(A, B, left=left)
    assert len(taken) == 1 and taken[0] is not None and X.shape == want.shape  # the fused path answered
    np.testing.assert_array_equal(cp.asnumpy(X).view(np.uint8), cp.asnumpy(want).view(np.uint8))
    singular = A.copy()
    singular[(0,) * len(a_batch)] = 0
    with pytest.raises(lu_core.SingularMatrixError):
        lu_core.solve(singular, B, left=left)


def test_the_direct_solve_checks_the_pivots_as_the_general_path_does(rng, monkeypatch):
    """Bad pivots reach no kernel unchecked on the direct path either: the same PivotError, naming the
    first bad pivot, as the general path's check_pivots."""
    A = well_conditioned(rng, (2, 3, 4, 4), np.float64)
    LU, piv = lu_core.lu_factor(cp.asarray(A))
    B = cp.asarray(random_matrix(rng, (2, 3, 4, 2), np.float64))
    for at, value in ((5, 0), (17, 5), (0, -7), (22, np.iinfo(np.int32).min), (9, np.iinfo(np.int32).max)):
        bad = piv.copy()
        bad.reshape(-1)[at] = value
        bad.reshape(-1)[-1] = 0  # a later bad one: the first is named
        with pytest.raises(lu_core.PivotError) as direct:
            lu_core.lu_solve(LU, bad, B)
        assert any(entry.name == "solve_direct" for entry in direct.traceback)  # raised by the direct path
        with monkeypatch.context() as m:
            _general_path(m)
            with pytest.raises(lu_core.PivotError) as general:
                lu_core.lu_solve(LU, bad, B)
        assert str(direct.value) == str(general.value)
        where = tuple(int(i) for i in np.unravel_index(at, piv.shape))
        assert f"value {value} at index {where} is outside [1, 4]" in str(direct.value)


def test_the_short_paths_leave_sizes_past_the_32_bit_api_to_the_general_path(rng, monkeypatch):
    """A matrix the libraries' 32-bit API cannot index (the limit lowered here) takes the general path, so
    its errors come in the general path's order: a bad pivot before the size, A's size in ``solve``."""
    from lu_core._gpu import _libs

    n = 40
    A = cp.asarray(well_conditioned(rng, (n, n), np.float64))
    B = cp.asarray(random_matrix(rng, (n, 3), np.float64))
    LU, piv = lu_core.lu_factor(A)
    monkeypatch.setattr(_libs, "INT32_MAX", n * n - 1)
    bad = piv.copy()
    bad[7] = n + 1
    with pytest.raises(lu_core.PivotError, match=r"value 41 at index \(7,\)"):
        lu_core.lu_solve(LU, bad, B)
    with pytest.raises(lu_core.ShapeError, match="LU"):
        lu_core.lu_solve(LU, piv, B)
    with pytest.raises(lu_core.ShapeError, match="A"):
        lu_core.solve(A, B)


@pytest.mark.parametrize(("batch", "raiser"), [((), "_direct_getrs"), ((1,), "_direct_getrs"), ((3,), "solve_direct")])
def test_the_direct_library_solve_checks_the_pivots_and_then_solves_on(rng, batch, raiser, monkeypatch):
    """Past n = 32 on the direct path, cuSOLVER ``getrs`` (one problem) or cuBLAS (more) read a checked copy
    of the pivots (a bad one as the first row, never out of bounds) and the flag is read after the solve
    is queued: the general path's PivotError all the same, and the next call (good pivots) answers right."""
    n = 40
    A = well_conditioned(rng, (*batch, n, n), np.float64)
    LU, piv = lu_core.lu_factor(cp.asarray(A))
    B = cp.asarray(random_matrix(rng, (*batch, n, 2), np.float64))
    for at, value in ((0, 0), (17, n + 1), (39, -3), (5, np.iinfo(np.int32).max)):
        bad = piv.copy()
        bad.reshape(-1)[at] = value
        with pytest.raises(lu_core.PivotError) as direct:
            lu_core.lu_solve(LU, bad, B)
        assert any(entry.name == raiser for entry in direct.traceback)
        with monkeypatch.context() as m:
            _general_path(m)
            with pytest.raises(lu_core.PivotError) as general:
                lu_core.lu_solve(LU, bad, B)
        assert str(direct.value) == str(general.value)
        X = lu_core.lu_solve(LU, piv, B)
        assert_close(cp.asnumpy(X), np.linalg.solve(A, cp.asnumpy(B)), np.float64, n)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "m", "n"), [((), 8, 8), ((5,), 6, 3), ((2, 3), 4, 7), ((1024,), 32, 32)])
def test_the_direct_unpack_gives_the_general_paths_bits_and_errors(rng, batch, m, n, dtype, monkeypatch):
    """``lu_unpack`` with the defaults on what ``lu_factor`` returns takes ``_unpack.unpack_direct`` (one
    launch, the user's pivots range-checked in it): the general path's P, L and U bit for bit, and its
    PivotError naming the first bad pivot."""
    from lu_core._gpu import _unpack
    from lu_core._gpu.backend import GpuBackend

    LU, piv = lu_core.lu_factor(cp.asarray(random_matrix(rng, (*batch, m, n), dtype)))
    taken = []
    real = _unpack.unpack_direct
    with monkeypatch.context() as mp:
        mp.setattr(_unpack, "unpack_direct", lambda *a: taken.append(real(*a)) or taken[-1])
        got = lu_core.lu_unpack(LU, piv)
    with monkeypatch.context() as mp:
        mp.setattr(GpuBackend, "unpack_direct", lambda self, *a, **k: None)
        want = lu_core.lu_unpack(LU, piv)
        bad = piv.copy()
        bad.reshape(-1)[-1] = 0
        bad.reshape(-1)[min(3, bad.size - 1)] = m + 1  # the first bad one (flat order) is named
        with pytest.raises(lu_core.PivotError) as general:
            lu_core.lu_unpack(LU, bad)
    assert len(taken) == 1 and taken[0] is not None  # the direct path answered
    for g, w in zip(got, want, strict=True):  # the same layouts too (L and U column-major)
        assert g.shape == w.shape and g.dtype == w.dtype and g.strides == w.strides
        np.testing.assert_array_equal(cp.asnumpy(g).view(np.uint8), cp.asnumpy(w).view(np.uint8))
    with pytest.raises(lu_core.PivotError) as direct:
        lu_core.lu_unpack(LU, bad)
    assert any(entry.name == "unpack_direct" for entry in direct.traceback)
    assert str(direct.value) == str(general.value)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "m", "n"), [((), 8, 8), ((4,), 7, 3), ((2, 3), 5, 9), ((700,), 32, 32)])
def test_lu_unpacks_its_own_factorization_in_one_launch(rng, batch, m, n, dtype, monkeypatch):
    """``lu()`` of small matrices: ``unpack_direct`` on its own pivots (trusted: no flag read back), the
    general path's P, L and U bit for bit and layout for layout."""
    from lu_core._gpu import _unpack
    from lu_core._gpu.backend import GpuBackend

    A = cp.asarray(random_matrix(rng, (*batch, m, n), dtype))
    taken = []
    real = _unpack.unpack_direct
    with monkeypatch.context() as mp:
        mp.setattr(_unpack, "unpack_direct", lambda *a: taken.append((a[-1], real(*a))) or taken[-1][1])
        got = lu_core.lu(A)
    with monkeypatch.context() as mp:
        mp.setattr(GpuBackend, "unpack_direct", lambda self, *a, **k: None)
        want = lu_core.lu(A)
    assert len(taken) == 1 and taken[0][0] is True and taken[0][1] is not None
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype and g.strides == w.strides
        np.testing.assert_array_equal(cp.asnumpy(g).view(np.uint8), cp.asnumpy(w).view(np.uint8))


@pytest.mark.parametrize(
    ("layout", "direct"),
    [("row-major", False), ("every other matrix", False), ("broadcast", False), ("int64 pivots", False),
     ("a batch dimension of one", True), ("offset view", True)],
)  # fmt: skip
def test_the_direct_unpack_takes_only_what_its_kernel_reads(rng, layout, direct, monkeypatch):
    """Layouts the kernel does not read (row-major, a strided or broadcast batch, other pivot dtypes) go
    to the general path; views it reads (a dimension of one, an offset into a larger factorization
    batch) it answers; every one gives the CPU's P, L and U."""
    from lu_core._gpu import _unpack

    LU, piv = lu_core.lu_factor(cp.asarray(random_matrix(rng, (6, 5, 5), np.float64)))
    if layout == "row-major":
        LU = cp.ascontiguousarray(LU)
    elif layout == "every other matrix":
        LU, piv = LU[::2], piv[::2].copy()
    elif layout == "broadcast":
        LU, piv = cp.broadcast_to(LU[0], (3, 5, 5)), cp.ascontiguousarray(cp.broadcast_to(piv[0], (3, 5)))
    elif layout == "int64 pivots":
        piv = piv.astype(cp.int64)
    elif layout == "a batch dimension of one":
        LU, piv = LU.reshape(2, 1, 3, 5, 5), piv.reshape(2, 1, 3, 5)
    else:
        LU, piv = LU[2:], piv[2:]
    taken = []
    real = _unpack.unpack_direct
    monkeypatch.setattr(_unpack, "unpack_direct", lambda *a: taken.append(real(*a)) or taken[-1])
    got = lu_core.lu_unpack(LU, piv)
    assert (taken[0] is not None) == direct
    for g, w in zip(got, lu_core.lu_unpack(cp.asnumpy(LU), cp.asnumpy(piv)), strict=True):
        np.testing.assert_array_equal(cp.asnumpy(g), w)


def test_singular_raises(rng):
    A = cp.asarray(np.stack([np.eye(3), np.zeros((3, 3))]))
    _, _, info = lu_core.lu_factor_ex(A)
    assert cp.asnumpy(info).tolist() == [0, 1]
    with pytest.raises(lu_core.SingularMatrixError):
        lu_core.lu_factor(A)


@pytest.mark.parametrize("nb", [3, 70000])  # the info copied whole, and searched on the device first
def test_singular_matrices_of_a_batch_are_named_as_on_the_cpu(nb):
    from lu_core._gpu.backend import INFO_ON_HOST_MAX

    assert (nb > INFO_ON_HOST_MAX) == (nb == 70000)
    A = np.tile(np.eye(2), (nb, 1, 1))
    A[[nb - 1, 1]] = 0
    A[nb // 2, 1, 1] = 0
    with pytest.raises(lu_core.SingularMatrixError) as cpu:
        lu_core.lu_factor(A)
    with pytest.raises(lu_core.SingularMatrixError) as gpu:
        lu_core.lu_factor(cp.asarray(A))
    assert str(gpu.value) == str(cpu.value)
    lu_core.lu_factor(cp.asarray(np.tile(np.eye(2), (nb, 1, 1))))  # none singular: no error


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "layout", ["as lu_factor leaves it", "row-major", "every other matrix", "uneven batch", "one matrix of 600"]
)
def test_lu_solve_check_errors_reads_each_diagonal_as_the_cpu(rng, dtype, layout):
    """``check_errors=True``: our diagonal_info kernel (the batch stepped through in place, or a copy of
    the diagonals where it does not step evenly) finds the CPU's first zeros, and lu_solve raises the
    CPU's error; a matrix without a zero raises nothing."""
    from lu_core._cpu.backend import CPU_BACKEND
    from lu_core._gpu.backend import GPU_BACKEND

    n = 600 if layout == "one matrix of 600" else 6
    batch = () if n == 600 else (4, 3)
    LU = cp.asarray(random_matrix(rng, (*batch, n, n), dtype) / n + 3 * np.eye(n, dtype=dtype))  # well conditioned
    LU = cp.asfortranarray(LU) if not batch else LU.swapaxes(-1, -2).copy().swapaxes(-1, -2)
    if layout == "row-major":
        LU = cp.ascontiguousarray(LU)
    elif layout == "every other matrix":
        LU = LU.reshape(-1, n, n)[::2]  # one step through the batch
    elif layout == "uneven batch":
        LU = LU[:, ::2]  # two: the kernel gets a copy of the diagonals
    clean = LU.copy()
    zeros = [(-1, 0), (0, n - 1), (1, 2), (1, 4)] if n == 6 else [(None, 290), (None, 513)]
    for b, i in zeros:
        if batch:
            idx = np.unravel_index(b % math.prod(LU.shape[:-2]), LU.shape[:-2])
            LU[(*idx, i, i)] = 0
        else:
            LU[i, i] = 0
    piv = cp.asarray(np.tile(np.arange(1, n + 1, dtype=np.int32), (*LU.shape[:-2], 1)))
    B = cp.asarray(random_matrix(rng, (*LU.shape[:-1], 2), dtype))
    want = CPU_BACKEND.diagonal_info(cp.asnumpy(LU))
    assert want.any()
    np.testing.assert_array_equal(cp.asnumpy(GPU_BACKEND.diagonal_info(LU)), want)
    with pytest.raises(lu_core.SingularMatrixError) as cpu:
        lu_core.lu_solve(cp.asnumpy(LU), cp.asnumpy(piv), cp.asnumpy(B), check_errors=True)
    with pytest.raises(lu_core.SingularMatrixError) as gpu:
        lu_core.lu_solve(LU, piv, B, check_errors=True)
    assert str(gpu.value) == str(cpu.value)
    X = lu_core.lu_solve(clean, piv, B, check_errors=True)
    assert_close(cp.asnumpy(X), lu_core.lu_solve(cp.asnumpy(clean), cp.asnumpy(piv), cp.asnumpy(B)), dtype, n)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 6, 6), (3, 5, 8), (3, 40, 40), (70, 70), (3, 40, 60)], ids=str)
def test_no_pivot_matches_cpu(rng, shape, dtype):
    """pivot=False: the CPU backend's (LAPACK getf2's) result, finite where a pivot is exactly zero."""
    m, n = shape[-2:]
    A = random_matrix(rng, shape, dtype)
    A[..., : min(m, n), : min(m, n)] += 4 * max(m, n) * np.eye(min(m, n), dtype=dtype)
    A3 = A.reshape(-1, m, n)
    A3[0, 0, 0] = 0  # an exact zero first pivot: a division by zero without the getf2 rule
    if len(A3) > 1:
        A3[-1, 2, :] = 0  # a zero row: a zero pivot further down
    LU_g, piv_g, info_g = lu_core.lu_factor_ex(cp.asarray(A), pivot=False)
    LU_c, piv_c, info_c = lu_core.lu_factor_ex(A, pivot=False)
    LU_g = cp.asnumpy(LU_g)
    assert np.isfinite(LU_g).all()
    np.testing.assert_array_equal(cp.asnumpy(piv_g), piv_c)
    np.testing.assert_array_equal(cp.asnumpy(info_g), info_c)
    assert_close(LU_g, LU_c, dtype, max(m, n), scale=max(1.0, float(np.abs(LU_c).max())))
    # lu: the CPU backend's L and U; L @ U is A where no pivot is exactly zero (where one is, getf2's
    # rule leaves its column unscaled and no L, U reproduce A: the CPU gives the same, seen on an H200).
    P, L, U = lu_core.lu(cp.asarray(A), pivot=False)
    _, L_c, U_c = lu_core.lu(A, pivot=False)
    assert P is None
    scale = max(1.0, float(np.abs(LU_c).max()))
    assert_close(cp.asnumpy(L), L_c, dtype, max(m, n), scale=scale)
    assert_close(cp.asnumpy(U), U_c, dtype, max(m, n), scale=scale)
    ok = (info_c == 0).reshape(-1)
    assert ok.any() == (len(A3) > 2)
    LU_prod = cp.asnumpy(L @ U).reshape(-1, m, n)
    assert_close(LU_prod[ok], A3[ok], dtype, max(m, n), scale=max(1.0, float(np.abs(A).max())))


def test_permutation_large_m(rng):
    piv = rng.integers(1, 20001, size=(2, 20000))
    piv = np.maximum(piv, np.arange(1, 20001))
    perm = lu_core.pivots_to_permutation(cp.asarray(piv), 20000)
    np.testing.assert_array_equal(cp.asnumpy(perm), lu_core.pivots_to_permutation(piv, 20000))


def test_matrices_beyond_int32_are_refused():
    from lu_core._gpu import _libs

    _libs.check_int32("A", 46340, 46340)  # 2^31 - 1 elements or fewer: accepted
    with pytest.raises(lu_core.ShapeError, match="2\\^31"):
        _libs.check_int32("A", 46341, 46341)


def test_factor_does_not_wait_for_the_device(rng):
    """lu_factor_ex only enqueues: on a stream blocked behind a long kernel it returns at once."""
    A = cp.asarray(random_matrix(rng, (2000, 16, 16), np.float64))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        spin = cp.RawKernel(
            r"""extern "C" __global__ void spin(long long cycles) {
                long long t0 = clock64(); while (clock64() - t0 < cycles) {} }""",
            "spin",
        )
        spin((1,), (1,), (np.int64(2_000_000_000),))  # about a second on any current GPU
        lu_core.lu_factor_ex(A)
        assert not stream.done, "lu_factor_ex waited for the device"
        stream.synchronize()


@pytest.mark.skipif(cp.cuda.runtime.getDeviceCount() < 2 if cp.cuda.is_available() else True, reason="needs two GPUs")
def test_arrays_on_another_device(rng):
    A = well_conditioned(rng, (3, 8, 8), np.float64)
    with cp.cuda.Device(1):
        A1 = cp.asarray(A)
    with cp.cuda.Device(0):
        LU, piv = lu_core.lu_factor(A1)
        assert LU.device.id == 1
        X = lu_core.lu_solve(LU, piv, A1)
    np.testing.assert_allclose(cp.asnumpy(X), np.broadcast_to(np.eye(8), (3, 8, 8)), atol=1e-10)
