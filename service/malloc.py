"""glibc malloc thresholds for a process that allocates and frees large arrays per request.

glibc serves an allocation above ``M_MMAP_THRESHOLD`` with a fresh ``mmap`` (every page
faulted in on first touch, ``munmap`` on free) and gives the top of its heap back to the
kernel once more than ``M_TRIM_THRESHOLD`` is free there (the next allocation faults it
in again). Its defaults adapt, but only up to 32 MiB: a 32-256 MiB array (a decoded
copy, an answer) is mapped, faulted in and unmapped on every request.

:func:`tune` raises both to 256 MiB once, at service start (``python -m service``), unless
the operator set ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or ``GLIBC_TUNABLES``
(then glibc has read them and they win). Measured (preliminary, a loaded 2-core VM):
allocating and filling a 32-128 MiB array costs 2-3x less on the main thread, ~1.5x less
at 32 MiB on a worker thread (a thread's arena cannot hold more than 64 MiB, so bigger
arrays are still mapped there, and request bodies come from ``service.bodies``' pool);
the end-to-end difference was within the noise (``bench/service.py`` reports the service
with glibc's defaults beside it). The price: up to 256 MiB of freed heap may stay resident,
outside ``LU_MAX_INFLIGHT_BYTES`` (like the interpreter's own heap). Off glibc (musl,
macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune"]

log = logging.getLogger("service")

# mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 256 << 20
TRIM_THRESHOLD = 256 << 20
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def tune(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Set glibc's mmap and trim thresholds; ``True`` when both were set, ``False`` (a no-op) elsewhere.

    Raises ``ValueError`` for a threshold that is not a positive number of bytes below 2**31.
    """
    for name, value in (("mmap_threshold", mmap_threshold), ("trim_threshold", trim_threshold)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 1 << 31:
            raise ValueError(f"{name} must be a positive number of bytes below 2**31, got {value!r}")
    if not sys.platform.startswith("linux") or any(os.environ.get(name) for name in _ENV):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        mallopt = libc.mallopt
        # gnu_get_libc_version exists on glibc only: musl's mallopt is a stub that does nothing.
        libc.gnu_get_libc_version  # noqa: B018
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, mmap_threshold) == 1 and mallopt(_M_TRIM_THRESHOLD, trim_threshold) == 1
    if not ok:
        log.warning("mallopt refused the thresholds (%d, %d); glibc keeps its own", mmap_threshold, trim_threshold)
    return ok
