"""The GPU backend's host-side logic, checked without a device.

* ``element_strides``: byte strides as element strides, or none; ``offset_terms``: ``block_offsets`` as
  the few terms the device computes them from.
* ``getrf_batched_wins``: PyTorch's cuBLAS / cuSOLVER crossover, at its edges.
* ``own_kernel``: which matrices our small-matrix kernel factors; ``getrf_width`` / ``getrs_width``: how
  many lanes serve one matrix (vector) there, and the launches built from them.

The kernels themselves (their index arithmetic, the warp pivot search) run on the host
under an emulation of CUDA in test_kernels_emulated.py, and on a device in the ``gpu``
tests (test_gpu_parity.py).
"""

from __future__ import annotations

import numpy as np

from lu_core._gpu import _tuning
from lu_core._gpu._broadcast import element_strides


def test_element_strides_refuses_partial_elements():
    assert element_strides((16, 8), 8) == (2, 1)
    assert element_strides((12, 4), 8) is None


def _from_terms(terms, nprob):
    t = np.arange(nprob, dtype=np.int64)
    return sum((t // i % s * st for i, s, st in terms), np.zeros(nprob, np.int64))


# (operand batch, its element strides, the output batch, terms expected)
OFFSET_CASES = [
    ((1000,), (24,), (1000,), 1),  # contiguous
    ((10, 20, 30), (7200, 360, 12), (10, 20, 30), 1),  # contiguous, several dimensions: merged into one
    ((10, 20, 30), (7200, 360, -12), (10, 20, 30), 2),  # reversed innermost: no longer one step
    ((1, 20, 30), (0, 360, 12), (10, 20, 30), 1),  # broadcast outer dimension
    ((10, 1, 30), (360, 12, 12), (10, 20, 30), 2),  # broadcast middle dimension: its neighbours stay apart
    ((30,), (12,), (4, 5, 30), 1),  # fewer dimensions than the output
    ((), (), (7, 9), 0),  # one block for every problem: offset 0
    ((2, 3, 2, 3, 2), (360, 100, 40, 11, 3), (2, 3, 2, 3, 2), 5),  # no two neighbours mergeable: host
    ((4, 1, 4, 1, 4, 1, 4), (2000, 0, 300, 0, 40, 0, 5), (4, 3, 4, 3, 4, 3, 4), 4),
    ((6, 1, 1), (8, 8, 8), (6, 1, 1), 1),  # size-1 dimensions, whatever their strides
]


def test_offset_terms_give_block_offsets():
    from lu_core._gpu._broadcast import MAX_TERMS, block_offsets, offset_terms

    for batch, strides, out_batch, count in OFFSET_CASES:
        terms = offset_terms(batch, strides, out_batch)
        assert len(terms) == count, (batch, terms)
        nprob = int(np.prod(out_batch))
        np.testing.assert_array_equal(_from_terms(terms, nprob), block_offsets(batch, strides, out_batch))
    assert MAX_TERMS == 4  # the kernel's parameters
    assert offset_terms((3, 0), (5, 1), (3, 0)) == ()  # no problems


def test_offset_terms_give_block_offsets_for_random_views_and_broadcasts():
    """Real views (sliced, reversed, transposed) broadcast to random output batches, 0 to 6 terms."""
    from lu_core._gpu._broadcast import block_offsets, element_strides, offset_terms

    rng = np.random.default_rng(12)
    counts = set()
    for _ in range(400):
        ndim = int(rng.integers(0, 6))
        base = np.zeros([int(rng.integers(1, 5)) * 2 for _ in range(ndim)] + [2, 3])
        view = base[tuple(slice(None, None, int(rng.choice([1, 2, -1, -2]))) for _ in range(ndim))]
        if ndim > 1 and rng.random() < 0.3:
            view = np.swapaxes(view, 0, ndim - 1)
        batch = list(view.shape[:-2])
        for d in range(ndim):
            if rng.random() < 0.25:
                view = view[(slice(None),) * d + (slice(0, 1),)]  # size 1: broadcast in the output
                batch[d] = 1
        out_batch = tuple(int(rng.integers(1, 4)) for _ in range(int(rng.integers(0, 2)))) + tuple(
            int(rng.integers(1, 4)) if s == 1 else s for s in view.shape[:-2]
        )
        strides = element_strides(view.strides, view.itemsize)[:-2]
        terms = offset_terms(tuple(view.shape[:-2]), strides, out_batch)
        counts.add(len(terms))
        nprob = int(np.prod(out_batch))
        np.testing.assert_array_equal(
            _from_terms(terms, nprob), block_offsets(tuple(view.shape[:-2]), strides, out_batch)
        )
    assert {0, 1, 2, 3} <= counts


def test_diagonal_steps_address_every_diagonal_entry_of_random_views():
    """``(step, s_diag)`` put entry i of matrix b's diagonal at b * step + i * s_diag from the view's first
    element, for every view whose batch steps evenly; None only where it does not."""
    from lu_core._gpu._broadcast import diagonal_steps

    rng = np.random.default_rng(13)
    seen = {True: 0, False: 0}
    for _ in range(300):
        ndim = int(rng.integers(0, 4))
        base = np.arange(np.prod([4] * ndim + [5, 6]), dtype=np.float64).reshape([4] * ndim + [5, 6])
        view = base[tuple(slice(None, None, int(rng.choice([1, 2, -1]))) for _ in range(ndim + 2))]
        if rng.random() < 0.3:
            view = np.swapaxes(view, -1, -2)
        if ndim and rng.random() < 0.2:
            view = np.broadcast_to(view[:1], view.shape)
        steps = diagonal_steps(view.shape, view.strides, view.itemsize)
        flat_view = view.reshape(-1, *view.shape[-2:])  # (a copy where the batch does not merge)
        diag = np.diagonal(flat_view, axis1=-2, axis2=-1)
        seen[steps is not None] += 1
        if steps is None:
            assert ndim >= 2  # one batch dimension always steps evenly
            continue
        step, s_diag = steps
        first = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // 8
        b, i = np.meshgrid(np.arange(diag.shape[0]), np.arange(diag.shape[1]), indexing="ij")
        np.testing.assert_array_equal(base.reshape(-1)[first + b * step + i * s_diag], diag)
    assert seen[True] > 100 and seen[False] > 10
    assert diagonal_steps((2, 3, 3), (9 * 16 + 8, 24, 8), 16) is None  # strides of partial elements


def test_index_terms_give_broadcast_index():
    """The solve's problem -> factorization map, computed on the device for large batches when the
    caller passes ``lu_index=None``: ``broadcast_index``'s values."""
    from lu_core._batching import broadcast_index
    from lu_core._gpu._broadcast import index_terms

    cases = [((600,), (600,)), ((1, 30), (40, 30)), ((3, 1), (5, 3, 200)), ((), (700,)), ((2, 1, 4), (2, 3, 4))]
    cases += [((4, 1, 4, 1, 4), (4, 3, 4, 3, 4))]  # five dimensions, three terms
    for batch, out_batch in cases:
        terms = index_terms(batch, out_batch)
        want = broadcast_index(batch, out_batch)
        np.testing.assert_array_equal(_from_terms(terms, len(want)), want)
    assert len(index_terms((600,), (600,))) == 1 and index_terms((), (700,)) == ()


def test_getrf_batched_heuristic_is_pytorchs():
    f32, f64, c64, c128 = (np.dtype(t) for t in (np.float32, np.float64, np.complex64, np.complex128))
    assert not _tuning.getrf_batched_wins(1, 8, f32)  # one matrix: cuSOLVER
    # batch 2: n * n <= 8400 * 2 (single), 2200 * 2 (double)
    assert _tuning.getrf_batched_wins(2, 129, f32) and not _tuning.getrf_batched_wins(2, 130, f32)
    assert _tuning.getrf_batched_wins(2, 66, c128) and not _tuning.getrf_batched_wins(2, 67, c128)
    # batch 8: 18600 * 8 (single), 16600 * 8 * isqrt(8) (float64), 5200 * 8 * 2 (complex128)
    assert _tuning.getrf_batched_wins(8, 385, c64) and not _tuning.getrf_batched_wins(8, 386, c64)
    assert _tuning.getrf_batched_wins(8, 515, f64) and not _tuning.getrf_batched_wins(8, 516, f64)
    assert _tuning.getrf_batched_wins(8, 288, c128) and not _tuning.getrf_batched_wins(8, 289, c128)


def test_own_kernel_takes_what_fits_in_a_warps_shared_memory(monkeypatch):
    own_kernel = _tuning.own_kernel

    monkeypatch.setattr(_tuning, "SMALL_FACTOR_MAX_N", 32)  # the values these edges are computed for
    monkeypatch.setattr(_tuning, "RECT_FACTOR_MAX_BYTES", 96 * 1024)
    f4, f8, c16 = np.dtype("f4"), np.dtype("f8"), np.dtype("c16")
    # Square: up to SMALL_FACTOR_MAX_N, above it the libraries (getrfBatched / cuSOLVER).
    assert own_kernel(32, 32, c16) and not own_kernel(33, 33, f4)
    # Rectangular, without opting in: (m | 1) x n x item size up to 48 KiB.
    assert own_kernel(33, 5, c16) and own_kernel(1, 32, f8)
    assert own_kernel(63, 48, c16) and not own_kernel(64, 48, c16)  # 63 * 48 * 16 = 48384; 65 * 48 * 16 = 49920
    assert own_kernel(127, 48, f8) and not own_kernel(128, 48, f8)
    assert own_kernel(2, 4096, f4) and not own_kernel(2, 4097, f4)  # 2 rows take 3
    assert not own_kernel(300, 100, f4)
    # Opted in: up to RECT_FACTOR_MAX_BYTES and the device's limit, whatever the batch.
    h100 = lambda: 227 * 1024  # noqa: E731
    assert own_kernel(64, 48, c16, h100) and own_kernel(127, 96, f8, h100)  # 97536 bytes
    assert not own_kernel(128, 96, f8, h100)  # 99072: over RECT_FACTOR_MAX_BYTES
    assert not own_kernel(127, 96, f8, lambda: 64 * 1024)  # over the device's limit
    assert not own_kernel(33, 33, f4, h100)  # squares: SMALL_FACTOR_MAX_N, never opted in


def test_group_widths_pack_small_matrices_and_vectors_into_a_warp():
    f4, f8, c16 = np.dtype("f4"), np.dtype("f8"), np.dtype("c16")
    width = _tuning.getrf_width
    # One lane a row, rounded up to a power of two; 32 rows and more take the warp.
    assert [width(m, m, f8) for m in (1, 2, 3, 4, 5, 8, 9, 17, 32)] == [1, 2, 4, 4, 8, 8, 16, 32, 32]
    assert width(100, 17, f8) == 32 and width(3, 64, f4) == 4
    # Wide matrices: as many a warp as fit 48 KiB. 2 x 100 complex128: 3 x 100 x 16 = 4800 bytes each,
    # 16 of them 76800 > 49152, 8 fit: 4 lanes. 2 x 1000: 48000 bytes, one a warp: 32 lanes.
    assert width(2, 100, c16) == 4 and width(2, 1000, c16) == 32
    for m, n, dt in ((2, 100, c16), (2, 1000, c16), (4, 700, f8), (8, 8, c16), (31, 31, c16), (45, 6, f4)):
        w = width(m, n, dt)
        assert w & (w - 1) == 0 and min(m, 32) <= w <= 32
        assert w == 32 or (32 // w) * _tuning.matrix_bytes(m, n, dt) <= _tuning.SHARED_BYTES
    assert [_tuning.getrs_width(n) for n in (1, 2, 3, 8, 9, 32)] == [1, 2, 4, 8, 16, 32]


def test_small_launches_give_each_group_its_matrix_and_its_shared_memory():
    from lu_core._gpu import _launch

    s = np.zeros((1000, 8, 8))
    launch = _launch.small_getrf(s, np.zeros((1000, 8), np.int32), np.zeros(1000, np.int32), 8, 8, True)
    assert launch.args[-1] == 8  # 8 lanes a matrix: 4 matrices a warp
    assert launch.block == (128,) and launch.grid == (63,)  # 250 warps' worth, 4 warps a block
    assert launch.shared == 4 * 4 * 9 * 8 * 8  # warps x groups x (ld = 9) x n x 8 bytes
    w3 = np.zeros((10, 3, 5))
    lu5 = np.zeros((10, 5, 5))
    spare, flag = np.zeros(1, np.int64), np.zeros(1, np.uint64)
    at = _launch.Indexed(None, 15)
    launch = _launch.small_getrs(
        lu5, np.zeros((10, 5), np.int32), _launch.Indexed(None, 1), w3, at, 5, 1, w3, 0,
        first_bad=flag, checked=False, spare=spare,
    )  # fmt: skip
    assert launch.args[-2] == 8 and launch.grid == (2,)  # 30 vectors, 4 a warp: 8 warps, 4 a block
    assert launch.args[-3] == 0 and launch.args[2] is spare and launch.args[5] is spare  # steps, no arrays
    index, offsets = np.zeros(10, np.int64), np.arange(10, dtype=np.int64) * 15
    launch = _launch.small_getrs(
        lu5, np.zeros((10, 5), np.int32), _launch.Indexed(index, 0), w3, _launch.Indexed(offsets, 0), 5, 1, w3, 2,
        first_bad=flag, checked=True, spare=spare, conjugate=True,
    )  # fmt: skip
    assert launch.args[-3] == 1 | 2 | 4 | 8 and launch.args[2] is index and launch.args[5] is offsets


def test_a_uniform_step_replaces_an_offset_array_where_one_serves():
    """``_broadcast.uniform_step``: the small solve takes ``t * step`` instead of an array (nothing sent
    up) exactly where that is each problem's offset, and None (an array) everywhere else."""
    from lu_core._gpu._broadcast import block_offsets, index_terms, offset_terms, uniform_step

    def check(batch, strides, out_batch):
        nprob = int(np.prod(out_batch))
        step = uniform_step(offset_terms(batch, strides, out_batch), nprob)
        want = block_offsets(batch, strides, out_batch)
        uniform = bool(np.all(want == np.arange(nprob) * (want[1] - want[0] if nprob > 1 else 0)))
        assert (step is not None) == uniform, (batch, strides, out_batch)
        if step is not None:
            np.testing.assert_array_equal(np.arange(nprob, dtype=np.int64) * step, want)
        return step

    assert check((4, 3), (36, 12), (4, 3)) == 12  # contiguous: one term
    assert check((), (), (5,)) == 0  # unbatched: every problem reads the one block
    assert check((1,), (7,), (6,)) == 0  # broadcast
    assert check((4,), (-12,), (4,)) == -12  # reversed
    assert check((2, 3), (40, 12), (2, 3)) is None  # padded between rows of the batch
    assert check((3,), (12,), (2, 3)) is None  # repeated: t % 3
    assert check((2, 1), (12, 12), (2, 5)) is None  # each block five times: t // 5
    assert uniform_step(index_terms((4, 3), (4, 3)), 12) == 1  # one LU each
    assert uniform_step(index_terms((1,), (9,)), 9) == 0  # one LU for all
    assert uniform_step(index_terms((3,), (2, 3)), 6) is None


def test_rect_factor_max_bytes_zero_sends_every_rectangular_batch_to_the_library(monkeypatch):
    own_kernel = _tuning.own_kernel

    monkeypatch.setattr(_tuning, "RECT_FACTOR_MAX_BYTES", 0)
    monkeypatch.setattr(_tuning, "SMALL_FACTOR_MAX_N", 32)
    assert not own_kernel(2, 3, np.dtype("f4")) and not own_kernel(33, 5, np.dtype("f8"), lambda: 1 << 20)
    assert own_kernel(32, 32, np.dtype("f8"))


def test_small_index_arrays_are_uploaded_once_per_device_and_contents(monkeypatch):
    """lu_core._gpu._constants: the solve's per-call index arrays (problem -> factorization, block offsets)
    are uploaded once per (device, dtype, shape, contents) on a stream of their own, waited for there once,
    then shared; large ones, and any once the table is full, are copied per call (never evicted). CuPy's
    upload, device and stream are stand-ins here (no GPU); on a device the parity tests run every solve
    through it."""
    import cupy

    from lu_core._gpu import _constants

    uploads, waits, current = [], [], {"id": 0, "stream": None}

    class Device:
        def __init__(self, index=None):
            self.index = index

        @property
        def id(self):
            return current["id"]

    class Stream:
        def __init__(self, non_blocking=False):
            self.device = current["id"]

        def __enter__(self):
            current["stream"] = self
            return self

        def __exit__(self, *exc):
            current["stream"] = None

        def synchronize(self):
            waits.append(self.device)

    def asarray(a):
        uploads.append((current["id"], a.dtype.str, a.shape, current["stream"] is not None))
        return object()

    monkeypatch.setattr(cupy, "asarray", asarray)
    monkeypatch.setattr(cupy.cuda, "Device", Device)
    monkeypatch.setattr(cupy.cuda, "Stream", Stream)
    monkeypatch.setattr(_constants, "_kept", {})
    monkeypatch.setattr(_constants, "_streams", {})
    index = np.arange(8, dtype=np.int64)
    first = _constants.on_device(index)
    assert _constants.on_device(index.copy()) is first and uploads == [(0, "<i8", (8,), True)] and waits == [0]
    assert _constants.on_device(index.astype(np.int32)) is not first  # another dtype: another array
    assert _constants.on_device(index.reshape(2, 4)) is not first  # another shape
    assert _constants.on_device(index[::-1]) is not first  # other contents (a strided view is read as such)
    current["id"] = 1
    assert _constants.on_device(index) is not first and uploads[-1][0] == 1 and waits[-1] == 1  # another device
    big = np.zeros(_constants.MAX_BYTES // 8 + 1, dtype=np.int64)
    before = len(uploads)
    _constants.on_device(big), _constants.on_device(big)
    assert len(uploads) == before + 2 and not uploads[-1][3] and len(waits) == 5  # per call, never waited for
    monkeypatch.setattr(_constants, "ENTRIES", len(_constants._kept))  # full: per call, nothing evicted
    kept = dict(_constants._kept)
    assert _constants.on_device(index + 100) is not _constants.on_device(index + 100)
    assert _constants._kept == kept and _constants.on_device(index) is kept[(1, "<i8", (8,), index.tobytes())]


def test_the_direct_unpack_takes_lu_factors_output_only():
    """``_validate.direct_unpack_shape`` and ``_layout.column_major_factors``, which decide what
    ``_unpack.unpack_direct`` gives its kernel, on NumPy arrays: lu_factor's layout (each matrix
    column-major, a contiguous batch, also behind an offset or with dimensions of one) passes; other
    layouts, pivot dtypes and shapes, empty sizes and other array types do not."""
    from lu_core._layout import column_major_factors
    from lu_core._validate import direct_unpack_shape

    dtypes, int32 = frozenset({np.dtype(np.float64)}), frozenset({np.dtype(np.int32)})
    LU = np.zeros((6, 4, 5)).swapaxes(-1, -2)  # (6, 5, 4), each matrix column-major, as lu_factor writes it
    piv = np.ones((6, 4), np.int32)

    def direct(lu, p):
        shape = direct_unpack_shape(lu, p, np.ndarray, dtypes, int32)
        return shape is not None and column_major_factors(lu) is not None and p.flags.c_contiguous

    assert direct_unpack_shape(LU, piv, np.ndarray, dtypes, int32) == ((6,), 5, 4, 6)
    assert direct(LU, piv)
    assert direct(LU[2:], piv[2:])  # a view behind an offset
    assert direct(LU.reshape(2, 1, 3, 5, 4), piv.reshape(2, 1, 3, 4))  # dimensions of one
    assert direct(LU[0], piv[0])  # one matrix
    assert not direct(np.ascontiguousarray(LU), piv)  # row-major
    assert not direct(LU[::2], piv[::2].copy())  # a strided batch
    assert not direct(np.broadcast_to(LU[0], (3, 5, 4)), piv[:3])  # a broadcast batch
    assert not direct(LU, piv.astype(np.int64))  # another pivot dtype (the general path converts)
    assert not direct(LU, piv[:, :3])  # pivots of another shape (the general path names it)
    assert not direct(LU.astype(np.float32), piv)  # a dtype not in the set
    assert not direct(LU[:0], piv[:0])  # an empty batch
    assert direct_unpack_shape(LU.tolist(), piv, np.ndarray, dtypes, int32) is None  # not the array type
    assert direct_unpack_shape(np.zeros(3), np.ones(3, np.int32), np.ndarray, dtypes, int32) is None


def test_the_unpack_takes_32_bit_indices_wherever_they_fit():
    """_launch.unpack's index type: int while every element index and the grid-stride loop's last step
    fit (one 8192^2 matrix: P, L and U, 2^27 elements), long long past that (the shapes stand in for
    arrays: zero-stride views, no memory)."""
    from lu_core._gpu import _launch

    def name(nb, m, want_p=True):
        src = np.broadcast_to(np.zeros(1), (nb, m, m))
        return _launch.unpack(src, src, src, True, src, src, m, True, want_p).name

    assert name(1, 8192) == "unpack<double, int>"
    assert name(1, 8) == "unpack<double, int>"
    assert name(16, 8192) == "unpack<double, long long>"  # 2^31 elements
    big = int(np.sqrt((_launch.INT_MAX - _launch.MAX_BLOCKS * _tuning.BLOCK) / 2))  # just fits, with the loop's step
    assert name(1, big) == "unpack<double, int>" and name(1, big + 1, True) == "unpack<double, long long>"


def test_the_short_kernels_launches_refuse_what_their_kernels_would_misread():
    """unpack_direct's int index arithmetic and m-int shared row order take matrices up to
    UNPACK_DIRECT_MAX_N; first_nonzero reads int32. Anything else is a ValueError naming it, not a launch."""
    import pytest

    from lu_core._gpu import _launch

    big = _tuning.UNPACK_DIRECT_MAX_N + 1
    s = np.zeros((1, 4, big))
    flag = np.zeros(1, np.uint64)
    with pytest.raises(ValueError, match=f"up to {_tuning.UNPACK_DIRECT_MAX_N}, got {big} x 4"):
        _launch.unpack_direct(s, np.ones((1, 4), np.int32), s, s, s, flag)
    with pytest.raises(ValueError, match="reads int32, got int64"):
        _launch.first_nonzero(np.zeros(70000, np.int64), flag)
    assert _launch.first_nonzero(np.zeros(70000, np.int32), flag).name == "first_nonzero"
