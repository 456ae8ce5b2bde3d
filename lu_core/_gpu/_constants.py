"""Small index arrays the solve sends to the device on every call, kept there.

Each ``lu_solve`` of up to 512 problems needs two small host-computed arrays on
the device: which factorization each problem uses (``lu_index``) and where each
problem's block of ``B`` starts (``block_offsets``); larger batches get them
computed on the device where they can (``_solve._from_terms``: an index the
caller passes, or one that takes more than four terms, is still copied up). A fresh ``cupy.asarray`` of each is a
host-to-device copy per call, in host time a large share of a small solve (the
first H200 run: 193 us for a 1x8 ``lu_solve`` against PyTorch's 35 us). They
repeat from call to call (the same shapes give the same arrays), so the first
``ENTRIES`` distinct arrays up to ``MAX_BYTES`` are kept on their device for the
life of the process; past that, arrays are copied per call as before.

A kept array is shared by every later call that asks for the same contents: the
kernels and libraries only read it, and nothing here may write into it. It is
uploaded on a stream of its own and waited for there once, so any stream may read
it afterwards without waiting for the caller's queued work. It is never freed:
an array freed back to CuPy's stream-ordered pool could be handed out again while
a kernel on another stream still reads it.
"""

from __future__ import annotations

import functools
import threading

import cupy as cp
import numpy as np

#: Arrays larger than this (bytes) are copied per call, not kept: 512 problems' int64 indices.
MAX_BYTES = 4096
#: Arrays kept per process (all devices together): at most 512 KiB of device memory.
ENTRIES = 128

_kept: dict[tuple[int, str, tuple[int, ...], bytes], cp.ndarray] = {}
_streams: dict[int, cp.cuda.Stream] = {}
_lock = threading.Lock()


def on_device(host: np.ndarray) -> cp.ndarray:
    """``host`` on the current device: a kept, shared, read-only copy when small, else a fresh one."""
    host = np.ascontiguousarray(host)
    if host.nbytes > MAX_BYTES:
        return cp.asarray(host)
    device_id = cp.cuda.Device().id
    key = (device_id, host.dtype.str, host.shape, host.tobytes())
    kept = _kept.get(key)
    if kept is not None:
        return kept
    with _lock:
        kept = _kept.get(key)
        if kept is None:
            if len(_kept) >= ENTRIES:
                return cp.asarray(host)  # full: a copy per call, never an eviction
            stream = _streams.get(device_id)
            if stream is None:
                stream = _streams[device_id] = cp.cuda.Stream(non_blocking=True)
            with stream:
                kept = cp.asarray(host)
            stream.synchronize()  # uploaded before any stream reads it
            _kept[key] = kept
    return kept


@functools.cache
def placeholders(device_id: int) -> tuple[cp.ndarray, cp.ndarray]:
    """A kernel's arguments for an index it is not given (int64) and for ``first_bad`` where no pivot can be
    bad (uint64): never read or written, kept on the device, looked up once per device."""
    with cp.cuda.Device(device_id):
        return on_device(np.zeros(1, dtype=np.int64)), on_device(np.zeros(1, dtype=np.uint64))
