"""Small index arrays the solve sends to the device on every call, kept there.

Each ``lu_solve`` needs two small host-computed arrays on the device: which
factorization each problem uses (``lu_index``) and where each problem's block of
``B`` starts (``block_offsets``). A fresh ``cupy.asarray`` of each is a
host-to-device copy per call, in host time a large share of a small solve (the
first H200 run: 193 us for a 1x8 ``lu_solve`` against PyTorch's 35 us). They
repeat from call to call (the same shapes give the same arrays), so arrays up to
``MAX_BYTES`` are kept on each device, ``ENTRIES`` of them, least recently used
first out.

A kept array is shared by every later call that asks for the same contents:
the kernels and libraries only read it, and nothing here may write into it. It is
uploaded and waited for once, on the stream current at the time, so any stream
may read it afterwards.
"""

from __future__ import annotations

import functools

import cupy as cp
import numpy as np

#: Arrays larger than this (bytes) are copied per call, not kept: 512 problems' int64 indices.
MAX_BYTES = 4096
#: Arrays kept per process (all devices together): a few hundred kilobytes of device memory at most.
ENTRIES = 128


def on_device(host: np.ndarray) -> cp.ndarray:
    """``host`` on the current device: a kept, shared, read-only copy when small, else a fresh one."""
    host = np.ascontiguousarray(host)
    if host.nbytes > MAX_BYTES:
        return cp.asarray(host)
    return _kept(cp.cuda.Device().id, host.dtype.str, host.shape, host.tobytes())


@functools.lru_cache(maxsize=ENTRIES)
def _kept(device_id: int, dtype: str, shape: tuple[int, ...], data: bytes) -> cp.ndarray:
    host = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)
    with cp.cuda.Device(device_id):
        kept = cp.asarray(host)
        cp.cuda.get_current_stream().synchronize()  # uploaded before any stream reads it
    return kept
