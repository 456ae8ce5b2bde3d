"""Where the CPU backend switches from its batched kernels to per-matrix LAPACK.

Measured with ``python -m bench.calibrate_cpu`` on the development machine
(2-core x86-64 with AVX-512, OpenBLAS 0.3.31), kernel time / LAPACK time on
the same data, about 2**22 elements per case:

    n     factor   solve nrhs=1   solve nrhs=n
    8      0.15       0.04           0.16
    16     0.20       0.10           0.38
    24     0.33       0.15           0.71
    32     0.50       0.20           1.25
    48     1.13       0.29           1.66
    64     1.50       0.30           1.88
    128    2.80       0.55           2.60
    384    5.64       0.86           4.99

Re-run the calibration on new hardware and update these numbers.
"""

from __future__ import annotations

#: Largest ``max(m, n)`` factored by the batched kernel (pivoted); LAPACK above.
FACTOR_KERNEL_MAX_N = 40

#: The batched solve kernel takes systems up to this ``n`` ...
SOLVE_KERNEL_MAX_N = 512

#: ... while ``n * nrhs`` stays at or below this (with many right-hand sides
#: LAPACK's ``getrs`` runs BLAS-3 ``trsm`` and wins) ...
SOLVE_KERNEL_MAX_WORK = 768

#: ... and always for ``n`` up to this, where a LAPACK call's overhead dominates.
SOLVE_KERNEL_ALWAYS_N = 16

#: Total work (about the flops: ``batch * m * n * k`` for a factorization,
#: ``2 * problems * nrhs * n * n`` for a solve, elements for copies) from which a
#: kernel runs on the thread pool instead of its serial twin. Waking the OpenMP pool
#: costs 8-77 us on a 2-core VM; the serial 8x8 factorization runs at ~1 step/ns.
#: Measured on a shared 2-vCPU AMD EPYC (``python -m bench.calibrate_cpu`` prints the
#: serial/parallel ratios): the parallel twin started to pay between 2**17 and 2**22
#: depending on the machine's load, so the crossover sits low in that range. It depends
#: on the size of the work only, never on the data, and both twins give the same bits.
PARALLEL_MIN_WORK = 1 << 18

#: Largest ``max(m, n)`` for which per-matrix LAPACK runs on the thread pool with
#: BLAS held to one thread, for any batch size, a single matrix included. Larger
#: matrices are factored one after another, each with BLAS's own threads. The
#: switch must not depend on the batch size: OpenBLAS's threaded ``getrf`` gives
#: other bits than its serial one from n = 200 on, and a matrix must get the same
#: bits alone as inside a batch.
LAPACK_POOL_MAX_N = 256

#: Largest ``max(m, n)`` unpacked by the fused per-matrix kernel; larger
#: matrices are split row-parallel so that one big matrix uses every core
#: (fused: 23 vs 27 ms at 100000x8x8, even at 16, 4% slower at 32).
UNPACK_FUSED_MAX_N = 16
