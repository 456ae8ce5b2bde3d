"""lu_core._cpu._direct: the short path of small default calls gives the general path's bits and errors,
is taken where it should be, and passes everything else on."""

from __future__ import annotations

import numpy as np
import pytest

import lu_core
from lu_core._cpu import _direct
from lu_core._cpu.backend import CpuBackend

DTYPES = (np.float32, np.float64, np.complex64, np.complex128)


def _rand(rng, shape, dtype):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


@pytest.fixture
def general(monkeypatch):
    """Run a call through the general path only."""

    def run(fn, *args, **kwargs):
        with monkeypatch.context() as m:
            m.setattr(CpuBackend, "factor_direct", staticmethod(lambda *a: None))
            m.setattr(CpuBackend, "solve_direct", staticmethod(lambda *a: None))
            m.setattr(CpuBackend, "system_direct", staticmethod(lambda *a: None))
            return fn(*args, **kwargs)

    return run


def _strides(x: np.ndarray) -> tuple[int, ...]:
    """The strides that place elements: an axis of extent 1 has one whatever its stride says."""
    return tuple(st for st, extent in zip(x.strides, x.shape, strict=True) if extent > 1)


def _same(got, want) -> None:
    for g, w in zip(got, want, strict=True):
        assert type(g) is type(w) and g.shape == w.shape and g.dtype == w.dtype and _strides(g) == _strides(w)
        assert g.flags.c_contiguous == w.flags.c_contiguous and g.flags.f_contiguous == w.flags.f_contiguous
        assert g.tobytes() == w.tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (8, 8), (32, 32), (5, 3), (3, 7), (1, 5), (5, 1)])
@pytest.mark.parametrize("layout", ["C", "F", "strided"])
@pytest.mark.parametrize("pivot", [True, False])
@pytest.mark.parametrize("batch", [(), (1,), (1, 1), (3,), (2, 1, 3)])
def test_factor_gives_the_general_paths_bits(general, dtype, shape, layout, pivot, batch):
    rng = np.random.default_rng(hash((shape, layout, batch)) % 2**32)
    if layout == "strided":  # every other row, and every other matrix of the batch
        A = _rand(
            rng, (*batch[:-1], 2 * batch[-1], 2 * shape[0], shape[1]) if batch else (2 * shape[0], shape[1]), dtype
        )
        A = A[..., ::2, :, :][..., ::2, :] if batch else A[::2]
    else:
        A = _rand(rng, (*batch, *shape), dtype)
    if layout == "F":
        A = np.asfortranarray(A) if not batch else np.ascontiguousarray(A.swapaxes(-1, -2)).swapaxes(-1, -2)
    assert _direct.factor_direct(A, pivot) is not None  # the short path is taken
    _same(lu_core.lu_factor_ex(A, pivot=pivot), general(lu_core.lu_factor_ex, A, pivot=pivot))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [(), (1,), (1, 1), (1, 1, 1)])
def test_factor_of_read_only_matrices_as_the_general_path(general, dtype, batch):
    """A read-only matrix (a binary request's body) of one matrix, without or with batch dimensions: the
    short path's bits, its outputs writable, the input untouched."""
    A = _rand(np.random.default_rng(len(batch)), (*batch, 8, 8), dtype)
    A.flags.writeable = False
    A0 = A.copy()
    assert _direct.factor_direct(A, True) is not None
    got = lu_core.lu_factor_ex(A)
    _same(got, general(lu_core.lu_factor_ex, A))
    assert all(x.flags.writeable for x in got) and np.array_equal(A, A0)


def test_factor_of_a_singular_matrix_raises_as_the_general_path(general):
    A = np.array([[1.0, 2.0], [2.0, 4.0]])
    with pytest.raises(lu_core.SingularMatrixError) as short:
        lu_core.lu_factor(A)
    with pytest.raises(lu_core.SingularMatrixError) as long:
        general(lu_core.lu_factor, A)
    assert str(short.value) == str(long.value)
    _same(lu_core.lu_factor_ex(A), general(lu_core.lu_factor_ex, A))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [(), (1,), (3,), (2, 3)])
@pytest.mark.parametrize(("n", "nrhs"), [(1, 1), (8, 1), (8, 3), (32, 2), (100, 1)])
def test_solve_gives_the_general_paths_bits(general, dtype, batch, n, nrhs):
    rng = np.random.default_rng(n * 7 + nrhs)
    A = _rand(rng, (*batch, n, n), dtype) + n * np.eye(n, dtype=dtype)
    LU, piv = lu_core.lu_factor(A)
    B = _rand(rng, (*batch, n, nrhs), dtype)
    for pivots in (piv, piv.astype(np.int64)):
        assert _direct.solve_direct(LU, pivots, B) is not None
        got, want = lu_core.lu_solve(LU, pivots, B), general(lu_core.lu_solve, LU, pivots, B)
        _same((got,), (want,))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(97, 97), (128, 128), (256, 256), (200, 130), (40, 250)])
@pytest.mark.parametrize("layout", ["C", "F"])
@pytest.mark.parametrize("batch", [(), (1,), (1, 1)])
def test_one_matrix_gives_the_general_paths_bits(general, dtype, shape, layout, batch, lapack):
    """One matrix past the kernels' sizes and within the LAPACK pool's goes straight to getrf, held to one
    thread as a pooled call is: the general path's bits, pivots and info, singular ones included; on MKL
    and on SciPy's OpenBLAS, whose two-thread getrf rounds otherwise (float64 200 x 200 and 256 x 256 on a
    2-vCPU AMD EPYC; the hold itself: test_batch_invariance.py)."""
    from lu_core._cpu import _tuning

    rng = np.random.default_rng(hash((shape, layout)) % 2**32)
    A = _rand(rng, (*batch, *shape), dtype)
    if layout == "F":
        A = np.ascontiguousarray(A.swapaxes(-1, -2)).swapaxes(-1, -2)
    if max(shape) <= (
        _tuning.FACTOR_KERNEL_COMPLEX_MAX_N if np.dtype(dtype).kind == "c" else _tuning.FACTOR_KERNEL_MAX_N
    ):
        pytest.skip("the kernels factor this size")
    assert _direct.factor_direct(A, True) is not None  # the short path is taken
    _same(lu_core.lu_factor_ex(A), general(lu_core.lu_factor_ex, A))
    singular = A.copy()
    singular[..., :, 3] = 0  # a zero column: info > 0, any shape
    got = lu_core.lu_factor_ex(singular)
    assert int(got[2].reshape(-1)[0]) > 0
    _same(got, general(lu_core.lu_factor_ex, singular))
    with pytest.raises(lu_core.SingularMatrixError):
        lu_core.lu_factor(singular)


def _system_sizes() -> list[int]:
    from lu_core._cpu import _tuning

    kernel = (8, _tuning.FACTOR_KERNEL_COMPLEX_MAX_N, _tuning.FACTOR_KERNEL_MAX_N)  # the fused kernel's (real)
    return sorted({*kernel, *(n + 1 for n in kernel[1:]), 128, _tuning.LAPACK_POOL_MAX_N})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", _system_sizes())
@pytest.mark.parametrize("rhs", ["vector", 1, 3, 8])
@pytest.mark.parametrize("layout", ["C", "F", "strided"])
def test_one_system_gives_the_general_paths_bits(general, monkeypatch, dtype, n, rhs, layout, lapack):
    """``solve`` of one system up to the LAPACK pool's sizes, with right-hand sides the kernel solves, without the
    general path's checks: where the kernels factor, the fused kernel's serial twin in one Numba call (A and B
    C-ordered; other layouts take the general path); past them getrf held to one thread, then the kernel's
    getrs. Its bits, singular systems included (raised alike, and the same infinities or NaNs without
    the check), on MKL and on SciPy's OpenBLAS (whose solve rule differs: float32 n > 96 with 8
    right-hand sides is the kernel's beside MKL only); the inputs untouched, X its own."""
    from lu_core._cpu import backend

    rng = np.random.default_rng(n * 3 + (0 if rhs == "vector" else rhs))
    A = _rand(rng, (2 * n, n), dtype)
    A = A[::2] if layout == "strided" else np.asfortranarray(A[:n]) if layout == "F" else A[:n].copy()
    B = _rand(rng, (n,) if rhs == "vector" else (n, rhs), dtype)
    Bs = {"C": B, "F": np.asfortranarray(B), "strided": _rand(rng, (2 * n, *B.shape[1:]), dtype)[::-2]}[layout]
    nrhs = 1 if rhs == "vector" else rhs
    taken = _direct.system_direct(A, Bs)
    dt = np.dtype(dtype)
    fused = backend._factor_by_kernel(n, dt)
    assert (taken is not None) == (backend._solve_by_kernel(n, nrhs, dt) and (not fused or layout == "C"))
    calls = []
    real = CpuBackend.system_direct
    monkeypatch.setattr(CpuBackend, "system_direct", staticmethod(lambda *a: calls.append(real(*a)) or calls[-1]))
    for x in (A, Bs):
        x.flags.writeable = False
    A0, B0 = A.copy(), Bs.copy()
    X = lu_core.solve(A, Bs)
    assert calls and (calls[-1] is not None) == (taken is not None)  # solve asked the short path first
    _same((X,), (general(lu_core.solve, A, Bs),))
    assert X.flags.owndata == general(lu_core.solve, A, Bs).flags.owndata and not np.shares_memory(X, Bs)
    assert np.array_equal(A, A0) and np.array_equal(Bs, B0)
    if taken is None:
        return
    singular = A.copy()
    singular[:, 3] = 0
    assert _direct.system_direct(singular, Bs) is not None
    _singular_as_the_general_path(general, singular, Bs)


def _singular_as_the_general_path(general, singular, B) -> None:
    """A singular system raises the general path's error (the same message, naming the same batch index) and,
    unchecked, gives its X."""
    with pytest.raises(lu_core.SingularMatrixError) as short:
        lu_core.solve(singular, B)
    with pytest.raises(lu_core.SingularMatrixError) as long:
        general(lu_core.solve, singular, B)
    assert str(short.value) == str(long.value)
    _same(
        (lu_core.solve(singular, B, check_errors=False),),
        (general(lu_core.solve, singular, B, check_errors=False),),
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", ["A", "B"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("fused", [True, False])
def test_one_system_with_non_finite_entries_as_the_general_path(general, dtype, where, value, fused):
    """A NaN or an infinity in the matrix or in the right-hand sides: the short path's answer (the
    propagated NaNs and infinities; not an error, LAPACK's info staying 0) is the general path's, with
    and without the check."""
    from lu_core._cpu import _tuning, backend

    n = 8 if fused else max(_tuning.FACTOR_KERNEL_MAX_N, _tuning.FACTOR_KERNEL_COMPLEX_MAX_N) + 1
    if not backend._solve_by_kernel(n, 1, np.dtype(dtype)):
        pytest.skip("LAPACK's getrs solves this size here")
    rng = np.random.default_rng(5)
    A = _rand(rng, (n, n), dtype) + n * np.eye(n, dtype=dtype)
    B = _rand(rng, (n, 1), dtype)
    (A if where == "A" else B)[n // 2, 0] = value
    assert _direct.system_direct(A, B) is not None
    for check_errors in (True, False):
        X = lu_core.solve(A, B, check_errors=check_errors)
        _same((X,), (general(lu_core.solve, A, B, check_errors=check_errors),))
    if where == "B" or np.isnan(value):  # (an infinite pivot can leave X finite, as in LAPACK: x[0] = -0 here)
        assert not np.isfinite(X).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("a_batch", "b_batch", "rhs"),
    [
        ((1,), (), "vector"),
        ((1,), (1,), "vector"),  # B of A's shape without its last dimension
        ((1, 1), (1, 1), "vector"),
        ((1, 1), (), "vector"),
        ((1,), (), 3),
        ((1,), (1,), 3),
        ((1,), (1, 1), 1),  # B's batch longer than A's
        ((1, 1), (1,), 3),
        ((), (1,), 3),
        ((), (1, 1), "vector"),  # not a vector: (1, 1, n) beside (n, n) is a matrix of one row (refused)
    ],
)
@pytest.mark.parametrize("n", [8, 128])
def test_one_system_in_a_batch_of_one_as_the_general_path(general, dtype, a_batch, b_batch, rhs, n):
    """One system with batch dimensions of extent 1 (the grid's and batched clients' single matrix) on A, on B,
    or both, B a matrix or a vector: the short path's answer is the general path's (shape, strides and bits),
    singular systems raise the same error (naming the same batch index) and give the same X unchecked."""
    rng = np.random.default_rng(len(a_batch) * 7 + len(b_batch))
    A = _rand(rng, (*a_batch, n, n), dtype)
    B = _rand(rng, (*b_batch, n) if rhs == "vector" else (*b_batch, n, rhs), dtype)
    refused = a_batch == () and rhs == "vector" and b_batch
    assert (_direct.system_direct(A, B) is None) == bool(refused)
    if refused:
        with pytest.raises(lu_core.ShapeError):
            lu_core.solve(A, B)
        return
    _same((lu_core.solve(A, B),), (general(lu_core.solve, A, B),))
    singular = A.copy()
    singular[..., 5] = 0
    assert _direct.system_direct(singular, B) is not None
    _singular_as_the_general_path(general, singular, B)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix
def test_systems_the_short_path_does_not_take():
    """A batch, broadcasting, mixed dtypes, integer input, lists, a matrix the kernels factor given in another
    layout than C-ordered (with a C-ordered B, or B in another), one the threaded LAPACK factors, right-hand sides LAPACK's getrs solves, wrong or empty shapes, left=False:
    None (or not asked), and the public call answers (or refuses) them as before."""
    from lu_core._cpu import _tuning

    rng = np.random.default_rng(11)
    n = 128
    A = rng.standard_normal((n, n)) + n * np.eye(n)
    B = rng.standard_normal((n, 2))
    assert _direct.system_direct(A, B) is not None
    big = _tuning.LAPACK_POOL_MAX_N + 1
    for args in (
        (np.stack([A, A]), B),
        (A, np.stack([B, B])),
        (A[None], np.stack([B, B])),  # B's batch is not one
        (np.stack([A, A])[:, None], B[None]),
        (A[None], B[None, None, :5]),
        (A, B.astype(np.float32)),
        (A.astype(np.int64), B),
        (A.tolist(), B),
        (A, B.tolist()),
        (np.asfortranarray(A[:8, :8]), B[:8]),  # the fused kernel's size: C-ordered A and B only
        (A[:8, :8], np.asfortranarray(B[:8])),
        (np.eye(big), np.ones((big, 1))),
        (A, rng.standard_normal((n, 64))),  # LAPACK's getrs solves 64 right-hand sides: A^T factored
        (A, B[:5]),
        (A[:, :5], B),
        (A, np.ones((n, 0))),
        (np.zeros((0, 0)), np.zeros((0, 1))),
        (A, np.float64(1.0)),
        (A, np.array(1.0)),
        (A, np.ones((n, 2, 1))),
        (np.asmatrix(A), B),
        (A, np.ma.masked_array(B)),
    ):
        assert _direct.system_direct(*args) is None
    np.testing.assert_allclose(lu_core.solve(A, np.stack([B, B])), np.linalg.solve(A, np.stack([B, B])))
    np.testing.assert_allclose(lu_core.solve(A, B.T, left=False), np.linalg.solve(A.T, B).T)
    for bad in (B[:5], np.float64(1.0)):
        with pytest.raises(lu_core.ShapeError):
            lu_core.solve(A, bad)


def test_lapack_single_matrices_take_the_general_path_where_they_should(lapack):
    """A batch, a size the threaded LAPACK takes (past LAPACK_POOL_MAX_N), or no pivoting: the general path."""
    from lu_core._cpu import _tuning

    rng = np.random.default_rng(5)
    A = rng.standard_normal((128, 128))
    assert _direct.factor_direct(A, True) is not None
    assert _direct.factor_direct(np.stack([A, A]), True) is None
    assert _direct.factor_direct(A, False) is None
    big = _tuning.LAPACK_POOL_MAX_N + 1
    assert _direct.factor_direct(rng.standard_normal((big, big)), True) is None


def test_out_of_range_pivots_raise_as_the_general_path(general):
    LU, piv = lu_core.lu_factor(np.eye(4) * 2)
    bad = piv.copy()
    bad[2] = 9
    B = np.ones((4, 1))
    with pytest.raises(lu_core.PivotError) as short:
        lu_core.lu_solve(LU, bad, B)
    with pytest.raises(lu_core.PivotError) as long:
        general(lu_core.lu_solve, LU, bad, B)
    assert str(short.value) == str(long.value)


def test_everything_else_takes_the_general_path():
    rng = np.random.default_rng(3)
    A = rng.standard_normal((4, 4)) + 4 * np.eye(4)
    LU, piv = lu_core.lu_factor(A)
    B = rng.standard_normal((4, 2))
    # Factor: integer or float16 input, lists, vectors, empty matrices or batches, sizes LAPACK takes.
    for x in (A.astype(np.int64), A.astype(np.float16), A.tolist(), A[0], np.ones((0, 3)), np.ones((2, 0, 4, 4))):
        assert _direct.factor_direct(x, True) is None
    assert _direct.factor_direct(np.eye(1000), True) is None
    # Solve: broadcasting, a C-ordered LU, mixed dtypes, int16 pivots, vectors, mismatched shapes, lists.
    for args in (
        (LU, piv, np.stack([B, B])),
        (np.ascontiguousarray(LU), piv, B),
        (LU, piv, B.astype(np.float32)),
        (LU, piv.astype(np.int16), B),
        (LU, piv, B[:, 0]),
        (LU, piv, B[:3]),
        (LU, piv[:3], B),
        (LU.tolist(), piv, B),
        (LU, piv, np.ones((4, 0))),
    ):
        assert _direct.solve_direct(*args) is None
    # ... and the public calls still answer them (or refuse them) as before.
    np.testing.assert_allclose(lu_core.lu_solve(np.ascontiguousarray(LU), piv, B), np.linalg.solve(A, B))
    with pytest.raises(lu_core.ShapeError):
        lu_core.lu_solve(LU, piv, B[:3])
