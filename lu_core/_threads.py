"""OpenMP settings for the CPU kernels, applied when ``lu_core`` is imported.

They must be in the environment before any GNU OpenMP runtime starts (Numba's first
parallel kernel, or a later ``import torch``), so ``lu_core/__init__`` imports this first.

OpenBLAS's idle threads also spin (~0.1 s after each threaded call, holding a core;
``OPENBLAS_THREAD_TIMEOUT``), but that is left at OpenBLAS's default: a short timeout made
SciPy's and JAX's own threaded calls 2-3x slower (their threads woken for every call), and
a library must not slow its neighbours. Set it in the environment where that trade is right.
"""

from __future__ import annotations

import os
import warnings

# Numba's OpenMP threading layer (GNU libgomp) keeps its threads spinning after each
# parallel region by default. Measured on 2 cores: the spinning threads slow the
# OpenBLAS getrf that follows a transpose kernel 2.6x (n = 512: 8.0 ms against
# 3.1 ms), and a pool that has gone idle between calls takes ~5 ms to wake for an
# 8x8 solve (0.26 ms with PASSIVE). PASSIVE puts idle threads to sleep at once;
# GOMP_SPINCOUNT=0 as well, because a libgomp loaded by PyTorch spins regardless of
# the policy (8.0 ms again with torch imported, 3.3 ms with both). They must be set
# before libgomp starts (first parallel kernel, or torch's import); values the user
# set win. They apply to every GNU OpenMP user in the process, PyTorch included.
_SETTINGS = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}


def started_openmp(maps: str = "/proc/self/maps") -> str | None:
    """The file of a GNU OpenMP runtime already mapped into this process (it read its settings from
    the environment when it was loaded), or None: none, or no ``/proc`` to tell (not Linux)."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
                path = fields[5].strip() if len(fields) > 5 else ""
                if "/libgomp" in path:
                    return path
    except OSError:
        return None
    return None


def _apply() -> None:
    unset = [name for name in _SETTINGS if name not in os.environ]
    if not unset:
        return
    started = started_openmp()
    if started is not None:  # too late for them: say so once, at import, with the remedy
        warnings.warn(
            f"lu_core: a GNU OpenMP runtime ({started}) started before lu_core was imported (by "
            f"torch, for one), so {' and '.join(f'{n}={_SETTINGS[n]}' for n in unset)} cannot reach it: "
            "its threads spin after each parallel kernel and slow the CPU path's next LAPACK call up to "
            "3x (n = 512). Import lu_core first, or set them in the environment.",
            RuntimeWarning,
            stacklevel=2,
        )
    for name in unset:
        os.environ[name] = _SETTINGS[name]


_apply()
