"""OpenMP and OpenBLAS thread settings for the CPU backend, applied when ``lu_core`` is imported.

They must be in the environment before any GNU OpenMP runtime starts (Numba's first
parallel kernel, or a later ``import torch``) and before an OpenBLAS is loaded (SciPy's,
whose LAPACK the backend calls, loads with ``scipy.linalg``), so ``lu_core/__init__``
imports this first. Values the user set win.
"""

from __future__ import annotations

import os

# Numba's OpenMP threading layer (GNU libgomp) keeps its threads spinning after each
# parallel region by default. Measured on 2 cores: the spinning threads slow the
# OpenBLAS getrf that follows a transpose kernel 2.6x (n = 512: 8.0 ms against
# 3.1 ms), and a pool that has gone idle between calls takes ~5 ms to wake for an
# 8x8 solve (0.26 ms with PASSIVE). PASSIVE puts idle threads to sleep at once;
# GOMP_SPINCOUNT=0 as well, because a libgomp loaded by PyTorch spins regardless of
# the policy (8.0 ms again with torch imported, 3.3 ms with both). They must be set
# before libgomp starts (first parallel kernel, or torch's import); values the user
# set win. They apply to every GNU OpenMP user in the process, PyTorch included.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("GOMP_SPINCOUNT", "0")

# OpenBLAS's idle worker threads spin for 2**28 cycles (~0.1 s) after each threaded
# call before they sleep, holding a core. Measured on 2 cores: 100 lu_solve problems of
# 128x128 with 64 right-hand sides (LAPACK on lu_core's own pool, one BLAS thread each)
# took 12-14 ms alone and 18-26 ms right after a threaded SciPy lu_solve; with 2**4 cycles
# 10-14 ms, and factorizations of n = 512 and 2048 (BLAS threaded inside) did not slow.
# In the service a large factorization's threads would otherwise spin beside the event loop.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
