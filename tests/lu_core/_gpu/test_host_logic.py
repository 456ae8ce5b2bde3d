"""The GPU backend's host-side logic and index arithmetic, checked without a device.

* ``block_offsets`` / ``element_strides``: replaying ``gather_rhs``'s address
  formula (kernels.cu) on NumPy memory gives the broadcast right-hand sides.
* ``getrf_batched_wins``: PyTorch's cuBLAS / cuSOLVER crossover, at its edges.
* the warp pivot search of small_lu.cu (``warp_pivot``), replayed lane by lane
  with XOR-butterfly shuffles, picks LAPACK's pivot (first largest, NaN rules),
  for a warp's 32 rows and for matrices whose rows wrap around the lanes.
* ``own_kernel``: which matrices our warp-per-matrix kernel factors.

These replay the formulas, not the CUDA code; the kernels themselves run in
the ``gpu`` tests (test_gpu_parity.py) on a device.
"""

from __future__ import annotations

import numpy as np
import pytest

from lu_core._gpu import _tuning
from lu_core._gpu._broadcast import block_offsets, element_strides


def _gather_replay(rhs: np.ndarray, base: np.ndarray, out_batch: tuple[int, ...], perm: np.ndarray | None):
    """gather_rhs's formula: w[t, r, i] = b[b_offset[t] + r * s_rhs + row * s_row]."""
    item = rhs.itemsize
    strides = element_strides(rhs.strides, item)
    assert strides is not None
    offsets = block_offsets(rhs.shape[:-2], strides[:-2], out_batch)
    start = (rhs.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // item
    nrhs, n = rhs.shape[-2:]
    nprob = len(offsets)
    w = np.empty((nprob, nrhs, n), rhs.dtype)
    for t in range(nprob):
        for r in range(nrhs):
            for i in range(n):
                row = perm[i] if perm is not None else i
                w[t, r, i] = base[start + offsets[t] + r * strides[-2] + row * strides[-1]]
    return w


@pytest.mark.parametrize(
    ("make", "out_batch"),
    [
        (lambda m: m[:24].reshape(2, 3, 4), (2,)),  # C-contiguous, no broadcast
        (lambda m: m[:24].reshape(2, 4, 3).swapaxes(-1, -2), (2,)),  # transposed view
        (lambda m: m[:12].reshape(1, 3, 4), (5,)),  # broadcast batch of one
        (lambda m: m[:12].reshape(3, 4), (2, 3)),  # no batch at all
        (lambda m: m[:48].reshape(2, 2, 3, 4)[:, ::-1], (3, 2, 2)),  # negative stride, extra leading dim
        (lambda m: m[:96].reshape(4, 6, 4)[::2, ::2, 1:], (2,)),  # sliced in every axis
    ],
    ids=["contiguous", "transposed", "broadcast", "unbatched", "negative", "sliced"],
)
@pytest.mark.parametrize("permute", [False, True])
def test_gather_offsets_replay(make, out_batch, permute):
    base = np.arange(200, dtype=np.complex128) * (1 + 1j)
    rhs = make(base)
    full = np.broadcast_to(rhs, (*out_batch, *rhs.shape[-2:]))
    n = rhs.shape[-1]
    perm = np.random.default_rng(3).permutation(n) if permute else None
    expected = full.reshape(-1, *rhs.shape[-2:])
    if perm is not None:
        expected = expected[..., perm]
    np.testing.assert_array_equal(_gather_replay(rhs, base, out_batch, perm), expected)


def test_element_strides_refuses_partial_elements():
    assert element_strides((16, 8), 8) == (2, 1)
    assert element_strides((12, 4), 8) is None


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


def _warp_pivot_replay(mag: np.ndarray, k: int, m: int) -> int:
    """small_lu.cu's warp_pivot, lane by lane: lane i scans its rows i, i + 32, ... from k (strictly
    larger wins), then the XOR butterfly over (value, index) across the 32 lanes."""
    if np.isnan(mag[k]):
        return k
    lanes = np.arange(32)
    v, idx = np.full(32, -1.0), np.full(32, m)
    for lane in lanes:
        r = k + ((lane - k) & 31)  # the kernel's first row of this lane at or after k
        while r < m:
            if mag[r] > v[lane]:  # False for NaN
                v[lane], idx[lane] = mag[r], r
            r += 32
    off = 16
    while off:
        ov, oi = v[lanes ^ off], idx[lanes ^ off]
        take = (ov > v) | ((ov == v) & (oi < idx))
        v, idx = np.where(take, ov, v), np.where(take, oi, idx)
        off >>= 1
    assert (idx == idx[0]).all(), "every lane must agree on the pivot"
    return int(idx[0])


def _idamax_from(mag: np.ndarray, k: int, m: int) -> int:
    """LAPACK's choice (and the CPU backend's): scan from k, keep the first strictly larger."""
    best, p = mag[k], k
    for i in range(k + 1, m):
        if mag[i] > best:
            best, p = mag[i], i
    return p


def test_warp_pivot_is_lapacks_choice():
    rng = np.random.default_rng(11)
    for _ in range(3000):
        m = int(rng.integers(1, 33)) if rng.random() < 0.5 else int(rng.integers(33, 200))  # rows over lanes
        k = int(rng.integers(0, m))
        mag = rng.integers(0, 4, size=m).astype(float)  # many ties
        special = rng.random(m)
        mag[special < 0.08] = np.nan
        mag[special > 0.95] = np.inf
        assert _warp_pivot_replay(mag, k, m) == _idamax_from(mag, k, m), (mag, k, m)


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


def test_rect_factor_max_bytes_zero_sends_every_rectangular_batch_to_the_library(monkeypatch):
    own_kernel = _tuning.own_kernel

    monkeypatch.setattr(_tuning, "RECT_FACTOR_MAX_BYTES", 0)
    monkeypatch.setattr(_tuning, "SMALL_FACTOR_MAX_N", 32)
    assert not own_kernel(2, 3, np.dtype("f4")) and not own_kernel(33, 5, np.dtype("f8"), lambda: 1 << 20)
    assert own_kernel(32, 32, np.dtype("f8"))
