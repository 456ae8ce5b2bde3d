"""The GPU backend's own CUDA kernels, run on the host under an emulation of CUDA (``simt``).

No GPU needed, and not a GPU test: the very ``kernels.cu`` and ``small_lu.cu``, compiled
for the host against ``simt/simt.h``, run with launches built by the backend's own
``lu_core._gpu._launch`` (its shapes and argument types, each argument checked against
the kernel's parameter), and also with a single block or warp so that every
grid-stride loop goes round more than once, and compared with the CPU backend, which is checked against LAPACK and PyTorch
elsewhere. Every dtype must give the CPU backend's bits where the CPU runs its own
kernels (the same operations in the same order; complex numbers are CuPy's own
``complex<T>``, and complex division goes through common.cuh's ``quotient``, the
CPU's algorithm), NaN where NaN. Every run is under AddressSanitizer +
UndefinedBehaviorSanitizer; a subset also under ThreadSanitizer, which reports
threads of a block touching the same memory without a barrier between them.
The last tests break a kernel on purpose to show each check fails.

What runs on a device (the NVRTC build, cuBLAS, cuSOLVER, CuPy's launch) is
checked by ``test_cuda_sources.py`` (compile) and the ``gpu``-marked tests (a lent GPU).
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest

pytest.importorskip("cupy", reason="make test installs cupy-cuda13x, whose headers (complex.cuh) the kernels use")

import lu_core
from lu_core._cpu import _kernels, backend
from lu_core._gpu import _broadcast, _launch, _sources, _tuning
from lu_core._layout import plan_split
from tests.lu_core._gpu import simt

if simt.compiler() is None:
    pytest.skip("no C++ compiler to build the kernels for the host", allow_module_level=True)

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
OPTIN = 227 * 1024  # an H100's opt-in shared memory per block


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("simt")


@pytest.fixture(scope="session")
def asan(build_dir):
    return simt.build("address", build_dir)


@pytest.fixture(scope="session")
def tsan(build_dir):
    return simt.build("thread", build_dir)


def _rand(rng, shape, dtype):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def _one_block(launch: _launch.Launch, threads: int = 32) -> _launch.Launch:
    """``launch`` on one block of ``threads`` (a warp per block for the small kernels: one round of its
    groups' matrices or vectors at a time), so each grid-stride loop runs over every item in turn."""
    if launch.source == "small_lu.cu":
        return launch._replace(grid=(1,), block=(32,), shared=launch.shared // (launch.block[0] // 32))
    return launch._replace(grid=(1,), block=(threads,))


LAUNCHES = ["backend", "one block"]


def _run(exe, launch: _launch.Launch, how: str = "backend") -> None:
    simt.run(exe, launch if how == "backend" else _one_block(launch))


def _same(got, want, dtype, exact=True) -> None:
    """Bits (where ``exact``: the CPU ran the same operations in the same order; for complex dtypes
    the kernels divide as the CPU does, common.cuh's quotient), NaN where NaN (its sign and payload
    are the hardware's); otherwise equal to rounding."""
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    if exact:
        parts_got, parts_want = (x.view(x.real.dtype) for x in (got, want))  # complex: (re, im) pairs
        nan = np.isnan(parts_want)
        np.testing.assert_array_equal(np.isnan(parts_got), nan)
        np.testing.assert_array_equal(parts_got[~nan].view(np.uint8), parts_want[~nan].view(np.uint8))
    else:
        tol = 1e-4 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-12
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True)


# ---------------------------------------------------------------- small_getrf


def _small_getrf(exe, A, pivot=True, how="backend", source="in place"):
    """``small_getrf`` as ``_factor._small`` launches it, on ``A`` (nb, m, n); returns (LU, piv, info).
    ``source``: the kernel factors a column-major copy in place (``in place``), or reads ``A`` as it is,
    C-ordered (``row-major``), or a column-major copy of it (``column-major``), writing LU elsewhere."""
    nb, m, n = A.shape
    piv = np.full((nb, min(m, n)), -7, np.int32)
    info = np.full(nb, -7, np.int32)
    if source == "in place":
        s = A.swapaxes(1, 2).copy()  # column-major per matrix (a copy: the kernel writes it)
        _run(exe, _launch.small_getrf(s, piv, info, m, n, pivot), how)
    else:
        s = np.full((nb, n, m), np.nan, A.dtype)
        rowmajor = source == "row-major"
        src = np.ascontiguousarray(A) if rowmajor else A.swapaxes(1, 2).copy()
        before = src.copy()
        _run(exe, _launch.small_getrf(s, piv, info, m, n, pivot, src, rowmajor), how)
        np.testing.assert_array_equal(src, before)  # read, never written
    return s.swapaxes(1, 2), piv, info


def _cpu_factor(A, pivot=True):
    return backend.CPU_BACKEND.lu_factor_ex(A, pivot)


def _cpu_kernel_factors(A, pivot=True) -> bool:
    """Whether the CPU backend factors ``A`` with its kernel (LAPACK's getf2 order, as the GPU kernel),
    not with LAPACK's blocked getrf (other rounding, same pivots)."""
    return not pivot or backend._factor_by_kernel(max(A.shape[-2:]), A.dtype)


SQUARE = [1, 2, 3, 8, 17, 31, 32]
RECT = [(2, 1), (1, 5), (40, 8), (8, 40), (33, 5), (5, 33), (64, 3), (3, 64), (100, 17)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(n, n) for n in SQUARE] + RECT, ids=str)
@pytest.mark.parametrize("pivot", [True, False])
def test_small_getrf_gives_the_cpu_factorization(asan, dtype, shape, pivot):
    _check_small_getrf(asan, dtype, shape, pivot, "backend")


def _check_small_getrf(asan, dtype, shape, pivot, how):
    m, n = shape
    assert _tuning.own_kernel(m, n, np.dtype(dtype)), "a shape the backend sends elsewhere"
    rng = np.random.default_rng(m * 100 + n)
    A = _rand(rng, (9, m, n), dtype)  # 9 matrices: several blocks, several warps a block
    if not pivot:
        A = A + 2 * max(m, n) * np.eye(m, n, dtype=dtype)  # keep the pivots away from zero
    LU, piv, info = _small_getrf(asan, A, pivot, how)
    want_lu, want_piv, want_info = _cpu_factor(A, pivot)
    np.testing.assert_array_equal(piv, want_piv)
    np.testing.assert_array_equal(info, want_info)
    _same(LU, want_lu, dtype, _cpu_kernel_factors(A, pivot))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(8, 8), (3, 3), (32, 32), (40, 8), (5, 33), (1, 4), (6, 1)], ids=str)
@pytest.mark.parametrize("source", ["row-major", "column-major"])
def test_small_getrf_reads_a_in_its_own_layout(asan, dtype, shape, source):
    """``_factor`` hands the kernel a C-ordered (or column-major) input as it is, instead of copying it
    transposed first: the same bits as in place, the input untouched, every entry of LU written."""
    A = _rand(np.random.default_rng(sum(shape)), (9, *shape), dtype)
    for pivot in (True, False):
        want = _small_getrf(asan, A, pivot)
        for how in LAUNCHES:
            got = _small_getrf(asan, A, pivot, how=how, source=source)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(_bits(g), _bits(w))
    s, piv, info = np.empty((9, shape[1], shape[0]), dtype), np.empty((9, min(shape)), np.int32), np.empty(9, np.int32)
    with pytest.raises(ValueError, match="source"):  # a source the kernel would misread is refused
        _launch.small_getrf(s, piv, info, *shape, True, A[::-1], source == "row-major")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(200, 30), (30, 200), (301, 40)], ids=str)
def test_small_getrf_beyond_48k_of_shared_memory(asan, dtype, shape):
    """Rectangular matrices the backend sends to the kernel with an opted-in shared memory."""
    m, n = shape
    dt = np.dtype(dtype)
    if not _tuning.own_kernel(m, n, dt, lambda: OPTIN):
        pytest.skip(f"{shape} {dt} goes to cuSOLVER")
    A = _rand(np.random.default_rng(5), (3, m, n), dtype)
    assert _launch.small_getrf(A, A[:, 0], A[:, 0, 0], m, n, True).shared <= OPTIN
    LU, piv, info = _small_getrf(asan, A)
    want_lu, want_piv, want_info = _cpu_factor(A)
    np.testing.assert_array_equal(piv, want_piv)
    np.testing.assert_array_equal(info, want_info)
    _same(LU, want_lu, dtype, _cpu_kernel_factors(A))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(8, 8), (32, 32), (45, 6), (70, 3)], ids=str)
def test_small_getrf_pivots_on_ties_zeros_and_non_finite_entries(asan, dtype, shape):
    """LAPACK's choice (first entry of largest |re| + |im|; a NaN diagonal stays; NaN below never
    chosen), info at the first zero pivot, and no NaN from 0 * Inf, as on the CPU."""
    m, n = shape
    if not _cpu_kernel_factors(np.empty((0, m, n), dtype)):
        pytest.skip("the CPU factors these with LAPACK, whose near-ties and NaN round and compare otherwise")
    rng = np.random.default_rng(7)
    ties = rng.integers(-2, 3, size=(24, m, n)).astype(dtype)  # many equal magnitudes
    if np.dtype(dtype).kind == "c":
        ties = ties + 1j * rng.integers(-2, 3, size=(24, m, n))  # |1+1j| ties |2| in LAPACK's measure
    singular = _rand(rng, (2, m, n), dtype)
    singular[0, :, 2] = 0  # a zero column: info = 3
    singular[1] = 0
    odd = rng.integers(-2, 3, size=(12, m, n)).astype(dtype)  # ties and non-finite entries together
    odd[0, 0, 0] = np.nan  # a NaN diagonal stays the pivot
    odd[1, m // 2, 0] = np.nan  # a NaN below it is never chosen
    odd[2, 1, 1] = np.inf
    where = rng.random((9, m, n))
    odd[3:][where < 0.05] = np.nan
    odd[3:][where > 0.97] = np.inf
    A = np.concatenate([ties, singular, odd]).astype(dtype)
    LU, piv, info = _small_getrf(asan, A)
    want_lu, want_piv, want_info = _cpu_factor(A)
    np.testing.assert_array_equal(piv, want_piv)
    np.testing.assert_array_equal(info, want_info)
    _same(LU, want_lu, dtype)


# ---------------------------------------------------------------- small_getrs


_SPARE, _NO_FLAG = np.zeros(1, np.int64), np.zeros(1, np.uint64)


def _small_getrs(exe, s, piv0, lu_index, w, trans, how="backend"):
    """``small_getrs`` on the right-hand sides (rows) of ``w``, in place, as ``_solve.lu_solve`` launches
    it for the API's broadcast: ``w`` read from a copy of itself, each problem's block a step on, and
    the factorizations through ``lu_index`` (0-based pivots, checked already)."""
    _, nrhs, n = w.shape
    b = w.copy()
    launch = _launch.small_getrs(
        s, piv0, _launch.Indexed(lu_index, 0), b, _launch.Indexed(None, nrhs * n), n, 1, w, trans,
        first_bad=_NO_FLAG, checked=False, spare=_SPARE,
    )  # fmt: skip
    _run(exe, launch, how)
    np.testing.assert_array_equal(_NO_FLAG, 0)  # never written when it checks nothing


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 8, 32])
@pytest.mark.parametrize("nrhs", [1, 2])
@pytest.mark.parametrize("trans", [0, 1, 2])
def test_small_getrs_gives_the_cpu_solution(asan, dtype, n, nrhs, trans):
    _check_small_getrs(asan, dtype, n, nrhs, trans, "backend")


def _check_small_getrs(asan, dtype, n, nrhs, trans, how):
    rng = np.random.default_rng(n * 10 + nrhs)
    A = _rand(rng, (3, n, n), dtype)
    LU, piv, _ = _cpu_factor(A)
    s = np.ascontiguousarray(LU.swapaxes(1, 2))  # column-major per matrix
    piv0 = (piv - 1).astype(np.int32)
    lu_index = np.array([0, 2, 1, 2, 0], np.int64)  # a broadcast LU: repeated, never copied
    w = _rand(rng, (len(lu_index), nrhs, n), dtype)  # right-hand sides as rows
    want = w.swapaxes(1, 2).copy()
    _kernels.getrs.serial(s, piv0, lu_index.astype(np.intp), want, trans)
    _small_getrs(asan, s, piv0, lu_index, w, trans, how)
    _same(w, want.swapaxes(1, 2), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_warp_strides_over_every_matrix_and_vector(asan, dtype):
    """The small kernels on a single warp: each warp's loop goes over several matrices (vectors),
    reusing its shared memory (registers), with the same results as the backend's launch."""
    for shape, pivot in (((8, 8), True), ((32, 32), True), ((40, 8), True), ((5, 33), False)):
        _check_small_getrf(asan, dtype, shape, pivot, "one block")
    for trans in (0, 1, 2):
        _check_small_getrs(asan, dtype, 8, 2, trans, "one block")


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view(np.uint8)


@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
def test_the_group_width_changes_no_result(asan, dtype, monkeypatch):
    """Each matrix (vector) is served by ``width`` lanes, ``32 // width`` of them a warp; any power of
    two gives the same bits (each entry sees the same operations in the same order), including the
    last warp's groups left without a matrix. The backend's width is the shape's, never the batch's."""
    rng = np.random.default_rng(11)
    for shape in ((8, 8), (5, 33), (40, 8), (3, 3)):
        A = _rand(rng, (7, *shape), dtype)
        odd = rng.integers(-2, 3, size=(6, *shape)).astype(dtype)  # ties, zero columns, NaN and Inf
        odd[0, 0, 0], odd[1, -1, 0], odd[2, 1, 1], odd[3] = np.nan, np.nan, np.inf, 0
        A = np.concatenate([A, odd])
        want = _small_getrf(asan, A)
        for width in (1, 2, 4, 8, 16, 32):
            monkeypatch.setattr(_tuning, "getrf_width", lambda m, n, dt, width=width: width)
            got = _small_getrf(asan, A)
            for g, w in zip(got, want, strict=True):  # bits: -0.0 is not 0.0, NaN payloads count
                np.testing.assert_array_equal(_bits(g), _bits(w), err_msg=f"{shape} width {width}")
        monkeypatch.undo()
    A = _rand(rng, (3, 5, 5), dtype)
    LU, piv, _ = _cpu_factor(A)
    s, piv0 = np.ascontiguousarray(LU.swapaxes(1, 2)), (piv - 1).astype(np.int32)
    w0 = _rand(rng, (7, 3, 5), dtype)  # 21 vectors: partial warps at every width
    for trans in (0, 1, 2):
        want = w0.copy()
        _small_getrs(asan, s, piv0, np.array([0, 2, 1, 2, 0, 1, 1], np.int64), want, trans)
        for width in (8, 16, 32):
            monkeypatch.setattr(_tuning, "getrs_width", lambda n, width=width: width)
            got = w0.copy()
            _small_getrs(asan, s, piv0, np.array([0, 2, 1, 2, 0, 1, 1], np.int64), got, trans)
            np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"trans {trans} width {width}")
        monkeypatch.undo()


# ---------------------------------------------------------------- subnormal pivots


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_subnormal_pivot_divides_instead_of_scaling_by_an_overflowing_reciprocal(asan, dtype):
    """LAPACK's getf2 (and the CPU backend): below the smallest normal number, divide by the pivot."""
    tiny = np.finfo(dtype).tiny
    A = np.array([[[tiny / 10, 1, 2], [tiny / 20, 1, 3], [tiny / 40, 2, 1]]], dtype)
    A = np.concatenate([A, A * 3, _rand(np.random.default_rng(1), (2, 3, 3), dtype) * tiny])
    LU, piv, info = _small_getrf(asan, A)
    want_lu, want_piv, want_info = _cpu_factor(A)
    assert np.isfinite(want_lu).all() and np.isfinite(LU).all()
    assert sorted(want_lu[0, 1:, 0]) == pytest.approx([0.25, 0.5], rel=1e-3)  # (tiny / 20) / (tiny / 10) ...
    np.testing.assert_array_equal(piv, want_piv)
    np.testing.assert_array_equal(info, want_info)
    _same(LU, want_lu, dtype)
    s, info = A.swapaxes(1, 2).copy(), np.array([1, 1, 1, 1], np.int32)  # the refactorization's rule too
    _run(asan, _launch.nopivot_refactor(A.swapaxes(1, 2).copy(), s, info, 3, 3))
    want_lu, _, want_info = _cpu_factor(A, pivot=False)
    np.testing.assert_array_equal(info, want_info)
    _same(s.swapaxes(1, 2), want_lu, dtype)


# ---------------------------------------------------------------- pivots

PIVOT_TYPES = sorted({np.dtype(f"{'i' if signed else 'u'}{size}") for size, signed in _sources.PIVOT_CTYPE})


@pytest.mark.parametrize("dt", PIVOT_TYPES, ids=str)
@pytest.mark.parametrize("how", LAUNCHES)
def test_check_pivots_converts_and_finds_the_first_bad_one(asan, dt, how):
    m = 5
    good = np.random.default_rng(1).integers(1, m + 1, size=(40, 4)).astype(dt)
    cases = [(good, None)]
    for bad_at, value in ((17, 0), (3, m + 1), (77, np.iinfo(dt).max)) + (((50, -1),) if dt.kind == "i" else ()):
        bad = good.copy()
        bad.reshape(-1)[bad_at] = value
        bad.reshape(-1)[150] = 0  # a later bad one: the first is reported
        cases.append((bad, bad_at))
    for (piv, first), base in itertools.product(cases, (0, 1)):  # base 1: the checked copy cuSOLVER reads
        flat = np.ascontiguousarray(piv.reshape(-1))
        piv0 = np.full(flat.shape, -7, np.int32)
        first_bad = np.full(1, np.iinfo(np.uint64).max, np.uint64)
        _run(asan, _launch.check_pivots(flat, piv0, m, first_bad, base=base), how)
        wide = flat.astype(np.int64) if dt != np.uint64 else flat.astype(np.float64)  # (values only compared)
        ok = (wide >= 1) & (wide <= m)
        if first is None:
            assert first_bad[0] == np.iinfo(np.uint64).max
        else:
            assert int(first_bad[0]) == first
        np.testing.assert_array_equal(piv0[~ok], base)  # the first row: never an index out of range
        np.testing.assert_array_equal(piv0[ok], flat[ok].astype(np.int64) - 1 + base)


@pytest.mark.parametrize("how", LAUNCHES)
def test_first_nonzero_finds_the_first_singular_matrix(asan, how):
    """A large batch's info searched on the device: the first non-zero entry's flat index, whichever
    thread or block meets it first; none left untouched."""
    info = np.zeros(5000, np.int32)
    first = np.full(1, np.iinfo(np.uint64).max, np.uint64)
    _run(asan, _launch.first_nonzero(info, first), how)
    assert first[0] == np.iinfo(np.uint64).max
    info[[4999, 3100, 1234]] = [7, -2, 1]  # -2: LAPACK's illegal-argument info counts too
    _run(asan, _launch.first_nonzero(info, first), how)
    assert first[0] == 1234


@pytest.mark.parametrize(("m", "k"), [(1, 1), (5, 3), (32, 32), (33, 20), (300, 300), (12289, 40)])
@pytest.mark.parametrize("how", LAUNCHES)
def test_row_orders_from_pivots(asan, m, k, how):
    """perm_small, perm_shared and perm_global, as ``_launch.permutations`` picks them."""
    nb = 6
    rng = np.random.default_rng(m)
    piv0 = np.stack([rng.integers(i, m, size=nb) for i in range(k)], axis=1).astype(np.int32)
    perm = np.full((nb, m), -7, np.int32)
    launch = _launch.permutations(piv0, perm)
    assert launch.name == ("perm_small" if m <= 32 else "perm_shared" if m <= 12288 else "perm_global")
    _run(asan, launch, how)
    np.testing.assert_array_equal(perm, backend.CPU_BACKEND.pivots_to_permutation(piv0, m))


# ---------------------------------------------------------------- diagonal_info


def _diagonal_info(exe, base, nb, k, s_batch, s_diag, how="backend"):
    info = np.full(nb, -7, np.int32)
    _run(exe, _launch.diagonal_info(np.ascontiguousarray(base), info, nb, k, s_batch, s_diag), how)
    return info


@pytest.mark.parametrize("how", LAUNCHES)
def test_diagonal_info_finds_each_first_zero_across_the_blocks_chunks(asan, how):
    """1 + the first exact zero of each diagonal (-0.0 is one, NaN is not), also past a block's first
    chunk of 256 threads and with several zeros in one chunk or in two; 0 without one: the CPU's."""
    k = 600
    rng = np.random.default_rng(5)
    A = rng.uniform(1, 2, (8, k, k))
    for b, zeros in ((1, [0]), (2, [k - 1]), (3, [280, 260]), (4, [257, 3]), (5, [290]), (6, [511, 512]), (7, [300])):
        A[b, zeros, zeros] = 0.0
    A[5, 10, 10] = np.nan
    A[7, 100, 100] = -0.0
    want = backend.CPU_BACKEND.diagonal_info(A)
    assert want.tolist() == [0, 1, k, 261, 4, 291, 512, 101]
    np.testing.assert_array_equal(_diagonal_info(asan, A, 8, k, k * k, k + 1, how), want)


DIAGONAL_LAYOUTS = {  # a (*batch, 7, 5) view of the buffer (6, 7, 5) (or (6, 5, 7), stored as transposes)
    "as lu_factor leaves it": lambda buf: buf.swapaxes(1, 2),
    "row-major": lambda buf: buf,
    "every other matrix": lambda buf: buf[::2],
    "reversed batch": lambda buf: buf[::-1],
    "broadcast one": lambda buf: np.broadcast_to(buf[2], (4, *buf.shape[1:])),
    "dimensions of one": lambda buf: buf.reshape(2, 1, 3, 1, *buf.shape[1:]),
    "columns reversed": lambda buf: buf[:, :, ::-1],
    "uneven batch": lambda buf: buf.reshape(2, 3, *buf.shape[1:])[:, ::2],
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", sorted(DIAGONAL_LAYOUTS))
def test_diagonal_info_reads_the_diagonals_through_the_steps_the_backend_computes(asan, dtype, layout):
    """Rectangular factorizations (min(m, n) diagonal entries) in the layouts users pass, read in place
    with ``_broadcast.diagonal_steps`` (as ``_solve.diagonal_info``) from a pointer to the view's first
    element: the CPU's info. A batch that does not step evenly has no steps (the backend copies)."""
    rng = np.random.default_rng(6)
    stored_t = layout == "as lu_factor leaves it"
    buf = _rand(rng, (6, 5, 7) if stored_t else (6, 7, 5), dtype) + 3
    V = DIAGONAL_LAYOUTS[layout](buf)
    assert V.shape[-2:] == (7, 5) and np.shares_memory(V, buf)
    flat = buf.reshape(-1)
    for b, i in ((1, 0), (2, 4), (3, 2), (4, 2), (4, 3), (5, 1)):  # zeros through the view's own indexing
        idx = np.unravel_index(b % math.prod(V.shape[:-2]), V.shape[:-2])
        off = sum(st * j for st, j in zip(V.strides, (*idx, i, i), strict=True)) // V.itemsize
        off += (V.__array_interface__["data"][0] - buf.__array_interface__["data"][0]) // V.itemsize
        flat[off] = 0
    steps = _broadcast.diagonal_steps(V.shape, V.strides, V.itemsize)
    want = backend.CPU_BACKEND.diagonal_info(V)
    assert want.any()
    if layout == "uneven batch":
        assert steps is None
        return
    first = (V.__array_interface__["data"][0] - buf.__array_interface__["data"][0]) // V.itemsize
    nb = math.prod(V.shape[:-2])
    info = np.full(nb, -7, np.int32)
    launch = _launch.diagonal_info(buf, info, nb, 5, *steps)
    _run(asan, launch._replace(args=(simt.At(np.ascontiguousarray(buf), first), *launch.args[1:])))
    np.testing.assert_array_equal(info, want.reshape(-1))


# ---------------------------------------------------------------- unpack


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 4), (6, 3), (3, 6), (40, 40)], ids=str)
@pytest.mark.parametrize("layout", ["column-major", "row-major"])
@pytest.mark.parametrize("want", ["both", "data", "P"])
@pytest.mark.parametrize("index", ["int", "long long"])
def test_unpack_gives_the_cpu_triangles_and_permutation(asan, dtype, shape, layout, want, index, monkeypatch):
    """The element-wise unpack, with 32-bit index arithmetic (where every index fits: the launch checks)
    and 64-bit (forced here by a smaller limit)."""
    if index == "long long":
        monkeypatch.setattr(_launch, "INT_MAX", 0)
    m, n = shape
    nb = 3
    A = _rand(np.random.default_rng(m + n), (nb, m, n), dtype)
    LU, piv = backend.CPU_BACKEND.lu_factor_ex(A, True)[:2]
    if layout == "row-major":
        LU = np.ascontiguousarray(LU)
    want_P, want_L, want_U = lu_core.lu_unpack(LU, piv)
    plan = plan_split(LU, nb, np.ascontiguousarray)  # as the GPU backend's _unpack, with NumPy
    unpack_data, want_p = want in ("both", "data"), want in ("both", "P")
    lower = np.full(plan.lower_shape, 7, dtype) if unpack_data else np.empty(0, dtype)
    upper = np.full(plan.upper_shape, 7, dtype) if unpack_data else np.empty(0, dtype)
    perm = np.empty(0, np.int32)
    if want_p:
        perm = np.ascontiguousarray(backend.CPU_BACKEND.pivots_to_permutation((piv - 1).astype(np.int32), m))
    p_mat = np.full((nb, m, m), 7, dtype) if want_p else np.empty(0, dtype)
    src = np.ascontiguousarray(plan.src)
    launch = _launch.unpack(src, lower, upper, plan.unit_lower, perm, p_mat, m, unpack_data, want_p)
    assert launch.name.endswith(f", {index}>")
    _run(asan, launch)
    if unpack_data:
        L, U = plan.assemble(lower, upper)
        _same(L, want_L, dtype)
        _same(U, want_U, dtype)
    if want_p:
        _same(p_mat, want_P, dtype)


def _unpack_direct(exe, LU, piv, how="backend"):
    """``unpack_direct`` as ``_unpack.unpack_direct`` launches it on ``lu_factor``'s (column-major) LU."""
    nb, m, n = LU.shape
    k = min(m, n)
    s = np.ascontiguousarray(LU.swapaxes(1, 2))
    P, Lt, Ut = (np.full(shape, 7, LU.dtype) for shape in ((nb, m, m), (nb, k, m), (nb, n, k)))
    first_bad = np.full(1, np.iinfo(np.uint64).max, np.uint64)
    _run(exe, _launch.unpack_direct(s, np.ascontiguousarray(piv, np.int32), P, Lt, Ut, first_bad), how)
    return P, Lt.swapaxes(1, 2), Ut.swapaxes(1, 2), first_bad[0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (4, 4), (6, 3), (3, 6), (32, 32), (32, 9)], ids=str)
@pytest.mark.parametrize("how", LAUNCHES)
def test_unpack_direct_gives_the_cpu_p_l_and_u(asan, dtype, shape, how):
    """One launch from lu_factor's output and the user's 1-based pivots: the CPU's P, L and U, bit for bit
    (every output element written: they start as 7s), and no bad pivot reported."""
    m, n = shape
    nb = 5
    LU, piv = backend.CPU_BACKEND.lu_factor_ex(_rand(np.random.default_rng(m * n), (nb, m, n), dtype), True)[:2]
    P, L, U, bad = _unpack_direct(asan, LU, piv, how)
    want_P, want_L, want_U = lu_core.lu_unpack(LU, piv)
    assert bad == np.iinfo(np.uint64).max
    for got, want in ((P, want_P), (L, want_L), (U, want_U)):
        _same(got, want, dtype)


@pytest.mark.parametrize("how", LAUNCHES)
def test_unpack_direct_reports_the_first_bad_pivot_and_reads_it_as_no_swap(asan, how):
    m = n = 5
    LU, piv = backend.CPU_BACKEND.lu_factor_ex(_rand(np.random.default_rng(3), (4, m, n), np.float64), True)[:2]
    for flat, value in ((7, 0), (13, m + 1), (2, -1), (19, np.iinfo(np.int32).min), (0, np.iinfo(np.int32).max)):
        bad = piv.copy()
        bad.reshape(-1)[flat] = value
        bad.reshape(-1)[flat + 1 if flat < 19 else 0] = 0 if flat < 19 else 1  # a later bad one is not reported
        P, _, _, first = _unpack_direct(asan, LU, bad, how)
        assert first == flat
        b, i = divmod(flat, n)
        fixed = bad.copy()
        fixed[b, i] = i + 1  # "no swap"
        if flat < 19:
            fixed.reshape(-1)[flat + 1] = flat % n + 2
        np.testing.assert_array_equal(P[b], lu_core.lu_unpack(LU[b], fixed[b])[0])  # never out of bounds


# ---------------------------------------------------------------- right-hand sides

LAYOUTS = {  # B (right-hand sides as rows, ``(*batch, nrhs, n)``) as a view of one buffer, and the output batch
    "contiguous": (lambda m: m[:24].reshape(2, 3, 4), (2,)),
    "transposed": (lambda m: m[:24].reshape(2, 4, 3).swapaxes(-1, -2), (2,)),
    "broadcast": (lambda m: m[:12].reshape(1, 3, 4), (5,)),
    "unbatched": (lambda m: m[:12].reshape(3, 4), (2, 3)),
    "negative": (lambda m: m[:48].reshape(2, 2, 3, 4)[:, ::-1], (3, 2, 2)),  # and an extra leading dimension
    "sliced": (lambda m: m[:96].reshape(4, 6, 4)[::2, ::2, 1:], (2,)),  # in every axis
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("use_perm", [False, True])
@pytest.mark.parametrize("conjugate", [False, True])
def test_gather_rhs_reads_b_through_its_strides_and_broadcast(asan, dtype, layout, use_perm, conjugate):
    """Problem t's right-hand side r, entry i = B[t's block][r, perm[lu_index[t], i] or i], conjugated on
    request, with B read through its strides and broadcast (never copied first), its offsets as
    ``_solve._offsets`` computes them (``_broadcast``), relative to B's first element as CuPy passes it
    (here: the whole buffer, and the offsets moved by B's first element)."""
    make, out_batch = LAYOUTS[layout]
    buffer = _rand(np.random.default_rng(3), (200,), dtype)
    rhs = make(buffer)
    nrhs, n = rhs.shape[-2:]
    strides = _broadcast.element_strides(rhs.strides, rhs.itemsize)
    offsets = _broadcast.block_offsets(tuple(rhs.shape[:-2]), strides[:-2], out_batch)
    first = (rhs.__array_interface__["data"][0] - buffer.__array_interface__["data"][0]) // buffer.itemsize
    nprob = len(offsets)
    rng = np.random.default_rng(nprob)
    perm = np.stack([rng.permutation(n) for _ in range(3)]).astype(np.int32)
    lu_index = rng.integers(0, 3, size=nprob).astype(np.int64)
    w = np.full((nprob, nrhs, n), 7, dtype)
    b = buffer.copy()
    _run(asan, _launch.gather_rhs(b, offsets + first, strides[-2], strides[-1], w, perm, lu_index, use_perm, conjugate))
    full = np.broadcast_to(rhs, (*out_batch, nrhs, n)).reshape(nprob, nrhs, n)
    want = np.stack([full[t][:, perm[lu_index[t]]] if use_perm else full[t] for t in range(nprob)])
    _same(w, np.conj(want) if conjugate else want, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.complex64])  # (every dtype's solve: the tests above)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("indexed", ["as _solve does", "arrays", "one LU"])
def test_small_getrs_reads_b_where_it_is(asan, dtype, layout, indexed):
    """The small solve reads its right-hand sides from B through B's strides and broadcast (as
    ``gather_rhs`` does), each problem's block a step on where ``_solve`` takes one
    (``_broadcast.uniform_step``; its factorization too) or from offset and index arrays, relative
    to B's first element as CuPy passes it (``simt.At``: inside the buffer), conjugating
    in and out on request: the bits of solving the materialised copy (then conjugating)."""
    make, out_batch = LAYOUTS[layout]
    buffer = _rand(np.random.default_rng(3), (200,), dtype)
    rhs = make(buffer)
    nrhs, n = rhs.shape[-2:]
    strides = _broadcast.element_strides(rhs.strides, rhs.itemsize)
    batch = tuple(rhs.shape[:-2])
    nprob = int(np.prod(out_batch))
    first = (rhs.__array_interface__["data"][0] - buffer.__array_interface__["data"][0]) // buffer.itemsize
    step = _broadcast.uniform_step(_broadcast.offset_terms(batch, strides[:-2], out_batch), nprob)
    if indexed == "arrays" or step is None:
        b_at = _launch.Indexed(_broadcast.block_offsets(batch, strides[:-2], out_batch), 0)
    else:
        b_at = _launch.Indexed(None, step)
    rng = np.random.default_rng(nprob)
    LU, piv, _ = _cpu_factor(_rand(rng, (nprob, n, n), dtype))
    s, piv0 = np.ascontiguousarray(LU.swapaxes(1, 2)), (piv - 1).astype(np.int32)
    if indexed == "arrays":
        lu_index = rng.permutation(nprob).astype(np.int64)
        lu_at = _launch.Indexed(lu_index, 0)
    elif indexed == "one LU":  # one factorization for every problem: step 0
        lu_index, lu_at = np.zeros(nprob, dtype=np.int64), _launch.Indexed(None, 0)
    else:
        lu_index, lu_at = np.arange(nprob, dtype=np.int64), _launch.Indexed(None, 1)
    for a in (s, piv0, b_at.array):
        if a is not None:
            a.flags.writeable = False  # inputs: simt fails the launch if the kernel writes one
    full = np.broadcast_to(rhs, (*out_batch, nrhs, n)).reshape(nprob, nrhs, n)
    for trans, conjugate in ((0, False), (0, True), (2, True), (1, False)):
        b = buffer.copy()
        b.flags.writeable = False
        w = np.full((nprob, nrhs, n), 7, dtype)
        launch = _launch.small_getrs(  # b: B's first element, as CuPy passes it (offsets may go back from there)
            s, piv0, lu_at, simt.At(b, first), b_at, strides[-2], strides[-1], w, trans,
            first_bad=_NO_FLAG, checked=False, spare=_SPARE, conjugate=conjugate,
        )  # fmt: skip
        _run(asan, launch)
        want = (np.conj(full) if conjugate else full).swapaxes(1, 2).copy()
        _kernels.getrs.serial(s, piv0, lu_index.astype(np.intp), want, trans)
        want = want.swapaxes(1, 2)
        _same(w, np.conj(want) if conjugate else want, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
@pytest.mark.parametrize("how", LAUNCHES)
def test_small_getrs_checks_the_users_pivots_itself(asan, dtype, how):
    """``solve_direct``'s launch: the user's 1-based int32 pivots as they are, range-checked by the
    kernel while it solves (every pivot of every factorization a problem uses is read): the first
    bad one's flat index in ``first_bad`` (never written when all are good), and with good pivots
    the unchecked launch's bits."""
    n, nlu, nrhs = 5, 5, 3  # 15 vectors, four a warp: the last warp's last group mirrors a problem, writes nothing
    rng = np.random.default_rng(5)
    LU, piv, _ = _cpu_factor(_rand(rng, (nlu, n, n), dtype))
    s = np.ascontiguousarray(LU.swapaxes(1, 2))
    rows = _rand(rng, (nlu, nrhs, n), dtype)
    imin, imax = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    cases = [(piv, None)]
    for at, value in ((7, 0), (3, n + 1), (13, imin), (18, imax), (11, -1)):
        bad = piv.copy()
        bad.reshape(-1)[at] = value
        bad.reshape(-1)[19] = 0  # a later bad one: the first is reported
        cases.append((bad, at))
    for trans in (0, 1, 2):
        want = rows.copy()
        _small_getrs(asan, s, (piv - 1).astype(np.int32), np.arange(nlu, dtype=np.int64), want, trans, how)
        for pivots, first in cases:
            first_bad = np.full(1, np.iinfo(np.uint64).max, np.uint64)
            w = np.full_like(rows, 7)
            launch = _launch.small_getrs(
                s, np.ascontiguousarray(pivots), _launch.Indexed(None, 1), rows.copy(), _launch.Indexed(None, nrhs * n),
                n, 1, w, trans, first_bad=first_bad, checked=True, spare=_SPARE,
            )  # fmt: skip
            _run(asan, launch, how)
            if first is None:
                assert first_bad[0] == np.iinfo(np.uint64).max
                np.testing.assert_array_equal(_bits(w), _bits(want))
            else:
                assert int(first_bad[0]) == first


@pytest.mark.parametrize("how", LAUNCHES)
def test_batch_offsets_gives_block_offsets(asan, how):
    """Large batches' offsets, computed on the device from ``offset_terms`` (``_solve._offsets``), are
    ``block_offsets``' (each layout above, and larger batches with broadcast and reversed dimensions)."""
    cases = [(LAYOUTS[name][0](np.zeros(200)), LAYOUTS[name][1]) for name in sorted(LAYOUTS)]
    big = np.zeros((40, 1, 30, 2, 3))[::-1, :, ::3]  # 40 x 1 x 10 blocks, reversed and strided
    cases.append((big, (7, 40, 6, 10)))
    for rhs, out_batch in cases:
        strides = _broadcast.element_strides(rhs.strides, rhs.itemsize)
        terms = _broadcast.offset_terms(tuple(rhs.shape[:-2]), strides[:-2], out_batch)
        out = np.full(int(np.prod(out_batch)), -7, np.int64)
        _run(asan, _launch.batch_offsets(out, terms), how)
        np.testing.assert_array_equal(out, _broadcast.block_offsets(tuple(rhs.shape[:-2]), strides[:-2], out_batch))


@pytest.mark.parametrize("how", LAUNCHES)
def test_batch_pointers_repeat_a_broadcast_factorization_and_step_through_the_right_hand_sides(asan, how):
    """cuBLAS's pointer arrays of ``_solve._pointers``: problem t's factorization at ``lu_index[t]`` (repeated
    where LU is broadcast), its right-hand sides one block after another; addresses past 32 and 47 bits."""
    nprob = 300
    lu_index = np.random.default_rng(6).integers(0, 7, size=nprob).astype(np.int64)
    for a_base, w_base in ((0x7F00_0000_1000, 0x7F10_0000_0000), (2**56 + 4096, 2**32 - 8)):
        a_ptrs = np.zeros(nprob, np.uint64)
        w_ptrs = np.zeros(nprob, np.uint64)
        _run(asan, _launch.batch_pointers(a_ptrs, w_ptrs, lu_index, a_base, 128 * 128 * 8, w_base, 3 * 128 * 8), how)
        want_a = [a_base + int(i) * 128 * 128 * 8 for i in lu_index]
        want_w = [w_base + t * 3 * 128 * 8 for t in range(nprob)]
        assert [int(p) for p in a_ptrs] == want_a and [int(p) for p in w_ptrs] == want_w


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("how", LAUNCHES)
def test_scatter_rows_applies_the_inverse_permutation(asan, dtype, how):
    n, nrhs, nprob = 6, 2, 5
    rng = np.random.default_rng(4)
    perm = np.stack([rng.permutation(n) for _ in range(2)]).astype(np.int32)
    lu_index = np.array([1, 0, 1, 1, 0], np.int64)
    w = _rand(rng, (nprob, nrhs, n), dtype)
    x = np.full_like(w, 7)
    _run(asan, _launch.scatter_rows(w, x, perm, lu_index), how)
    want = np.empty_like(w)
    for t in range(nprob):
        want[t][:, perm[lu_index[t]]] = w[t]
    _same(x, want, dtype)


# ---------------------------------------------------------------- nopivot_refactor


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 4), (7, 3), (3, 7), (70, 50)], ids=str)
@pytest.mark.parametrize("how", LAUNCHES)
def test_nopivot_refactor_gives_the_cpu_result_for_flagged_matrices(asan, dtype, shape, how):
    """Matrices the libraries flagged (info != 0) are factored again with LAPACK getf2's rule (the
    CPU backend's): finite output; the others are left as they are."""
    m, n = shape
    rng = np.random.default_rng(m * n)
    A = _rand(rng, (3, m, n), dtype) + 3 * max(m, n) * np.eye(m, n, dtype=dtype)
    A[0, 1, 1] = A[0, 1, 0] * A[0, 0, 1] / A[0, 0, 0]  # a zero second pivot without pivoting
    A[2, 0, 0] = 0  # a zero first pivot
    kept = A.swapaxes(1, 2).copy()
    s = np.full_like(kept, np.nan)  # what the library left: NaN / Inf after dividing by the zero
    s[1] = 5  # not flagged: must stay as it is
    info = np.array([2, 0, 1], np.int32)
    _run(asan, _launch.nopivot_refactor(kept, s, info, m, n), how)
    want_lu, _, want_info = _cpu_factor(A[[0, 2]], pivot=False)
    assert (s[1] == 5).all()
    np.testing.assert_array_equal(info[[0, 2]], want_info)
    assert info[1] == 0
    _same(s[[0, 2]].swapaxes(1, 2), want_lu, dtype)


# ---------------------------------------------------------------- races


@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
def test_no_races_between_the_threads_of_a_block(tsan, dtype):
    """ThreadSanitizer over every kernel that shares memory between threads: the factorization
    (shared memory, shuffles; square and rectangular, several warps a block), the solves (shuffles;
    all three ``trans``), the row orders in shared memory, the refactorization (__syncthreads), the
    diagonal's first zero (shared memory, atomics and barriers), the one-launch unpack (its row order)."""
    rng = np.random.default_rng(8)
    # Widths 8, 32, 32, 8, 2, 4, 16 (lanes a matrix: one row each); 6 matrices: partial warps.
    for shape in ((8, 8), (32, 32), (45, 6), (6, 45), (2, 2), (3, 3), (12, 12)):
        A = _rand(rng, (6, *shape), dtype)
        LU, piv, _ = _small_getrf(tsan, A)
        np.testing.assert_array_equal(piv, _cpu_factor(A)[1])
        _same(LU, _cpu_factor(A)[0], dtype, _cpu_kernel_factors(A))
    for shape in ((1, 5), (3, 3)):  # width 1 (no shuffles: only __syncwarp orders), and rounds a warp loops over
        A = _rand(rng, (40, *shape), dtype)
        LU, piv, _ = _small_getrf(tsan, A, how="one block")
        np.testing.assert_array_equal(piv, _cpu_factor(A)[1])
    A = _rand(rng, (3, 8, 8), dtype)
    LU, piv, _ = _cpu_factor(A)
    s = np.ascontiguousarray(LU.swapaxes(1, 2))
    for trans in (0, 1, 2):
        w = _rand(rng, (4, 2, 8), dtype)
        _small_getrs(tsan, s, (piv - 1).astype(np.int32), np.array([0, 1, 2, 0], np.int64), w, trans)
    perm = np.full((2, 100), -1, np.int32)
    piv0 = np.stack([rng.integers(i, 100, size=2) for i in range(100)], axis=1).astype(np.int32)
    _run(tsan, _launch.permutations(piv0, perm))
    kept = np.ascontiguousarray(_rand(rng, (2, 20, 20), dtype))
    _run(tsan, _launch.nopivot_refactor(kept, np.full_like(kept, np.nan), np.array([1, 3], np.int32), 20, 20))
    D = _rand(rng, (3, 300, 300), dtype) + 1
    D[0, [40, 270, 280], [40, 270, 280]] = 0  # zeros in two chunks; found in the first one
    D[1, [270, 299], [270, 299]] = 0  # in the second chunk only
    got = _diagonal_info(tsan, D, 3, 300, 300 * 300, 301)
    np.testing.assert_array_equal(got, [41, 271, 0])
    LU, piv = _cpu_factor(_rand(rng, (3, 20, 12), dtype))[:2]  # the row order in shared memory, read across threads
    P, _, _, bad = _unpack_direct(tsan, LU, piv, how="one block")
    assert bad == np.iinfo(np.uint64).max
    np.testing.assert_array_equal(P, lu_core.lu_unpack(LU, piv)[0])


# ---------------------------------------------------------------- the checks can fail


def _broken(build_dir, sanitizer, source, old, new, monkeypatch):
    """A runner of ``source``'s kernels alone, with ``old`` replaced by ``new`` (once)."""
    real = simt.host_source

    def edited(name):
        text = real(name)
        if name == source:
            assert text.count(old) == 1, "the edit no longer matches the source"
            text = text.replace(old, new)
        return text

    monkeypatch.setattr(simt, "host_source", edited)
    return simt.build(sanitizer, build_dir, (source,))


def test_a_wrong_tie_rule_is_caught(build_dir, monkeypatch):
    exe = _broken(build_dir, "address", "small_lu.cu", "(ov == v && oi < idx)", "(ov == v && oi > idx)", monkeypatch)
    A = np.ones((2, 8, 8)) + np.eye(8)[None, ::-1]  # ties in every column
    A[1] = np.random.default_rng(0).integers(-1, 2, size=(8, 8))
    _, piv, _ = _small_getrf(exe, A)
    assert (piv != _cpu_factor(A)[1]).any()


def test_a_grid_stride_step_that_skips_matrices_is_caught(build_dir, monkeypatch):
    """With the backend's launch every group of lanes has its own matrix; one warp has to stride."""
    exe = _broken(
        build_dir, "address", "small_lu.cu", "b0 += nwarps * groups)", "b0 += 2 * nwarps * groups)", monkeypatch
    )
    A = np.random.default_rng(0).standard_normal((5, 8, 8))
    LU, _, _ = _small_getrf(exe, A, how="one block")
    assert not np.array_equal(LU, _cpu_factor(A)[0])


BREAKS = {  # a defect put into small_getrf: (build, the source's text, its broken form, the input, the report)
    "shared-memory overrun": (
        "address",
        "const int ld = m | 1;",
        "const int ld = m + 1;",  # odd m: each warp's matrix one row longer than its share
        (8, 9, 9),  # two matrices a warp, four warps a block: the last one overruns the block's memory
        "AddressSanitizer",
    ),
    "missing __syncwarp": (
        "thread",
        "__syncwarp();  // the swapped rows, and every lane's reads of the column, before it changes",
        "// (no barrier)",
        (2, 40, 8),
        "ThreadSanitizer: data race",
    ),
    "divergent shuffles": (
        "address",
        "for (int off = width >> 1; off > 0; off >>= 1) {",
        "for (int off = width >> 1; off > (g & 1); off >>= 1) {",
        (1, 8, 8),
        "divergent barrier",
    ),
}


@pytest.mark.parametrize("defect", sorted(BREAKS))
def test_a_broken_factorization_kernel_is_caught(build_dir, monkeypatch, defect):
    sanitizer, old, new, shape, report = BREAKS[defect]
    exe = _broken(build_dir, sanitizer, "small_lu.cu", old, new, monkeypatch)
    with pytest.raises(simt.KernelFailed, match=report):
        _small_getrf(exe, np.random.default_rng(0).standard_normal(shape))


def test_a_local_array_overrun_after_a_barrier_is_caught(build_dir, monkeypatch):
    """A thread's own array, written past its end after the thread has waited at a barrier (its kernel's
    frame paused while other threads ran): AddressSanitizer still sees the array's bounds."""
    exe = _broken(
        build_dir,
        "address",
        "small_lu.cu",
        "__syncwarp();  // the swapped rows, and every lane's reads of the column, before it changes",
        "volatile int probe[4] = {}; volatile int* p = probe; __syncwarp(); p[4 + (threadIdx.x & 1)] = 1;",
        monkeypatch,
    )
    with pytest.raises(simt.KernelFailed, match="stack-buffer-overflow"):
        _small_getrf(exe, np.random.default_rng(0).standard_normal((1, 8, 8)))


def test_a_deadlock_is_reported_at_once(build_dir, monkeypatch):
    """Half of each warp waits at its warp's barrier, the other half at the block's: no thread can go on,
    and the emulator says so as soon as none can (not after a timeout)."""
    exe = _broken(
        build_dir,
        "address",
        "small_lu.cu",
        "__syncwarp();  // the swapped rows, and every lane's reads of the column, before it changes",
        "if ((threadIdx.x & 31) < 16) __syncwarp(); else __syncthreads();",
        monkeypatch,
    )
    monkeypatch.setattr(simt, "run", functools.partial(simt.run, timeout=20))  # the OS-thread emulator took 60 s
    with pytest.raises(
        simt.KernelFailed, match=r"__syncwarp at line \d+: 16 of 32 threads arrived, the rest never did"
    ):
        _small_getrf(exe, np.random.default_rng(0).standard_normal((16, 8, 8)))  # four warps, each busy


def test_lanes_at_different_calls_of_one_shuffle_helper_are_caught(build_dir, monkeypatch):
    """The same count of shuffles, the same source line, but two call sites of small_lu.cu's shfl()."""
    exe = _broken(
        build_dir,
        "address",
        "small_lu.cu",
        "const T xj = shfl(x, j, width);\n                if (mine && g > j)",
        "const T xj = mine ? shfl(x, j, width) : shfl(x, j, width);\n                if (mine && g > j)",
        monkeypatch,
    )
    A = np.random.default_rng(0).standard_normal((1, 8, 8))
    LU, piv, _ = _cpu_factor(A)
    w = np.ones((1, 1, 8))
    with pytest.raises(simt.KernelFailed, match="divergent barrier"):
        _small_getrs(
            exe, np.ascontiguousarray(LU.swapaxes(1, 2)), (piv - 1).astype(np.int32), np.zeros(1, np.int64), w, 1
        )


def test_a_write_into_a_read_only_argument_is_caught(asan):
    """The emulator's check that inputs stay inputs: an output passed read-only fails the launch."""
    A = np.random.default_rng(0).standard_normal((1, 4, 4))
    s = A.swapaxes(1, 2).copy()
    piv, info = np.zeros((1, 4), np.int32), np.full(1, -7, np.int32)  # the kernel writes 0 there
    info.flags.writeable = False
    with pytest.raises(simt.KernelFailed, match="wrote into a read-only argument"):
        simt.run(asan, _launch.small_getrf(s, piv, info, 4, 4, True))


def test_a_wrong_argument_type_is_caught(asan):
    A = np.random.default_rng(0).standard_normal((1, 4, 4))
    s = A.swapaxes(1, 2).copy()
    piv, info = np.zeros((1, 4), np.int32), np.zeros(1, np.int32)
    launch = _launch.small_getrf(s, piv, info, 4, 4, True)
    with pytest.raises(simt.KernelFailed, match="argument 5: the kernel takes a 8-byte signed integer"):
        simt.run(asan, launch._replace(args=(*launch.args[:5], np.int32(1), *launch.args[6:])))
    with pytest.raises(simt.KernelFailed, match="argument 3: the kernel takes a pointer to 4-byte items of kind i"):
        simt.run(asan, launch._replace(args=(*launch.args[:3], piv.astype(np.int64), *launch.args[4:])))
    with pytest.raises(simt.KernelFailed, match="argument 0: the kernel takes a pointer to 8-byte items of kind f"):
        simt.run(asan, launch._replace(args=(s.astype(np.float32), *launch.args[1:])))


def test_cupys_complex_division_by_a_subnormal_pivot_is_caught(build_dir, monkeypatch):
    """Why the kernels divide with common.cuh's quotient(): CuPy's complex operator/ scales by
    1 / (|re| + |im|) first, which overflows for a subnormal divisor, and the quotient is NaN."""
    exe = _broken(
        build_dir, "address", "small_lu.cu", "col[r] = quotient(col[r], d);", "col[r] = col[r] / d;", monkeypatch
    )
    tiny = np.finfo(np.complex128).tiny
    A = np.array([[[tiny / 10, 1], [tiny / 20, 1]]], np.complex128)
    LU, _, _ = _small_getrf(exe, A)
    assert np.isnan(LU).any() and np.isfinite(_cpu_factor(A)[0]).all()
