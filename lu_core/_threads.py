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
# 8x8 solve (0.26 ms with PASSIVE). PASSIVE puts idle threads to sleep at once, and
# GOMP_SPINCOUNT=0 with it. libgomp reads them once, when it loads: first parallel
# kernel, or ``import torch`` (whose libgomp serves Numba too). An earlier note here said
# PyTorch's libgomp spun whatever the policy; re-measured (2026-11-27, 512x512 float32
# lu_factor on OpenBLAS, torch imported first): 8.0 ms with lu_core setting them (too
# late), 2.2 ms with OMP_WAIT_POLICY=PASSIVE alone in the environment. So the policy is
# what matters: unset, both are set (and a runtime already started is reported); a
# policy the user set wins, GOMP_SPINCOUNT=0 joining only a PASSIVE one. They apply to
# every GNU OpenMP user in the process, PyTorch included.
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
    policy = os.environ.get("OMP_WAIT_POLICY")
    if policy is None:
        started = started_openmp()
        if started is not None:  # too late for it: say so once, at import, with the remedy
            warnings.warn(
                f"lu_core: a GNU OpenMP runtime ({started}) started before lu_core was imported (by "
                "torch, for one), so OMP_WAIT_POLICY=PASSIVE cannot reach it: its threads spin after "
                "each parallel kernel and slow the CPU path's next LAPACK call up to 3x (n = 512). "
                "Import lu_core first, or set OMP_WAIT_POLICY=PASSIVE in the environment.",
                RuntimeWarning,
                stacklevel=2,
            )
        os.environ["OMP_WAIT_POLICY"] = policy = "PASSIVE"
    if policy.strip().upper() == "PASSIVE":
        os.environ.setdefault("GOMP_SPINCOUNT", "0")


_apply()
