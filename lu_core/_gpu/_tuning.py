"""Dispatch thresholds of the GPU backend, in one table.

PROVISIONAL: these follow NVIDIA's guidance for the batched cuBLAS routines
(intended for many small matrices) and have NOT yet been calibrated on a
device: no GPU was available to the session that wrote this backend. Replace
them with the crossovers measured on an H200 by the GPU calibration benchmark
(issue 3, "GPU unverified").
"""

from __future__ import annotations

#: cuBLAS ``getrfBatched`` for square matrices up to this n, when the batch
#: has at least ``GETRF_BATCHED_MIN_BATCH`` matrices; cuSOLVER ``getrf`` per
#: matrix otherwise (and always for rectangular matrices).
GETRF_BATCHED_MAX_N = 64
GETRF_BATCHED_MIN_BATCH = 2

#: cuBLAS ``getrsBatched`` for systems up to this n with at least
#: ``GETRS_BATCHED_MIN_BATCH`` problems; cuSOLVER ``getrs`` per problem otherwise.
GETRS_BATCHED_MAX_N = 64
GETRS_BATCHED_MIN_BATCH = 2

#: From this many right-hand sides on, solve as a row permutation plus two
#: cuBLAS ``trsm`` calls (BLAS-3) per problem.
TRSM_MIN_NRHS = 64

#: Threads per block for the element-wise kernels.
BLOCK = 256
