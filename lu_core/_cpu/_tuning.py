"""Where the CPU backend switches from its batched kernels to per-matrix LAPACK.

Measured with ``python -m bench.calibrate_cpu`` (2-core x86-64, AVX-512,
OpenBLAS 0.3.31): the batched factor kernel beats a pool of LAPACK ``getrf``
calls up to n = 48 and loses from n = 64 on; the batched solve kernel beats
``getrs`` for one right-hand side up to n = 256 but loses well before that
once there are many right-hand sides (``getrs`` then runs BLAS-3 ``trsm``).
Re-run the calibration on new hardware and update these numbers.
"""

from __future__ import annotations

#: Largest ``max(m, n)`` factored by the batched kernel (pivoted).
FACTOR_KERNEL_MAX_N = 48

#: Largest ``n`` solved by the batched kernel ...
SOLVE_KERNEL_MAX_N = 256

#: ... as long as ``n * nrhs`` stays at or below this (else LAPACK ``getrs``).
SOLVE_KERNEL_MAX_WORK = 4096
