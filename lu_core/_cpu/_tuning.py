"""Where the CPU backend switches from its batched kernels to per-matrix LAPACK.

Measured with ``python -m bench.calibrate_cpu`` on a 2-vCPU AMD EPYC VM
(OpenBLAS 0.3.31; the machine shared with other jobs, so +-30%), kernel time /
LAPACK time on the same data, about 2**22 elements per case, after the kernels'
update loops were made vectorizable:

    n     factor   solve nrhs=1   solve nrhs=n
    8      0.19       0.06           0.21
    16     0.40       0.15           0.58
    32     0.73       0.71           1.57
    48     0.98       0.42           1.79
    64     0.81       0.53           2.71
    96     0.88       0.62           3.00
    128    1.32       0.63           4.63
    256    2.10       0.81           5.88

A single matrix (batch 1, serial kernel against one LAPACK call) gives the
same picture: the kernel wins to n = 96 (0.6x) and loses from 128 (1.4x).

These crossovers were measured against SciPy's OpenBLAS. MKL (``_mkl``, used on Intel CPUs where installed, and
on others for the threaded factors ``MKL_THREADED_FACTOR_*`` name) is
as fast as OpenBLAS at n = 128 (one 128 x 128 ``getrf``: 0.084-0.088 ms against 0.090-0.096, 2-vCPU
Intel Xeon, 2026-11-27) and pulls ahead from n = 256, past every kernel/LAPACK crossover below, so
they stand for both, except the solve kernel's limits (``SOLVE_KERNEL_OPENBLAS_*``: OpenBLAS's ``getrs``
beats MKL's on AMD's CPUs); ``bench.calibrate_cpu`` measures whichever LAPACK the process chose.

Re-run the calibration on new hardware and update these numbers. (That table is the first
calibration, before the kernels' loops vectorized; the limits below were re-measured since,
each with its numbers.)
"""

from __future__ import annotations

#: Largest ``max(m, n)`` factored by the batched kernel (pivoted, real dtypes); LAPACK above.
#: Re-measured 2026-11-25 with LAPACK's copies fused into its pool tasks (kernel / LAPACK,
#: batch 1 and ~2**21 elements, two runs; ``bench.calibrate_cpu`` prints the table): float64
#: 0.74-0.89 at 80, 1.00-1.15 at 96, 1.03-1.20 at 112, 1.24-1.60 at 128; float32 0.64-0.91
#: at 96, 0.77-1.00 at 112, 1.07-1.33 at 128. One limit for both: 96 is a little late for
#: float64 and a little early for float32, both within this machine's noise.
FACTOR_KERNEL_MAX_N = 96

#: The same for complex dtypes, whose kernel loops do not vectorize: complex128 kernel /
#: LAPACK 0.64-0.85 at n = 32, 0.94-1.30 at 48, 1.5-2.1 from 64 to 96 (same runs); complex64
#: (a run beside other load, complex parts random): 0.67-1.08 at 32, 1.04-1.61 at 48, 1.5-2.1 at 64.
FACTOR_KERNEL_COMPLEX_MAX_N = 32

#: Largest ``max(m, n)`` of real matrices factored a group of eight at a time, one per SIMD lane
#: (``_lanes``), when the batch has a group at all. Serial kernel time, lanes / one matrix at a
#: time (2026-11-26, the same bits): float64 8x8 0.73-0.74, 5x7 and 7x5 0.59-0.67, 16x16 0.64;
#: float32 8x8 0.69-0.88, 16x16 0.62; at 32x32 float64 loses (1.6x), float32 gains little (0.9x).
LANES_MAX_N = 16

#: The batched solve kernel takes systems up to this ``n`` ...
SOLVE_KERNEL_MAX_N = 512

#: ... while ``n * nrhs`` stays at or below this (with many complex right-hand
#: sides LAPACK's ``getrs`` runs BLAS-3 ``trsm`` and wins) ...
SOLVE_KERNEL_MAX_WORK = 768

#: ... and always for ``n`` up to this, where a LAPACK call's overhead dominates;
SOLVE_KERNEL_ALWAYS_N = 16

#: for real dtypes, up to this ``n`` ...
#: the kernel's loops over the right-hand sides vectorize (complex ones do not). Kernel
#: time / LAPACK time, float32 and float64, batch 1 and 100, nrhs 8 to 256 (2026-11-25):
#: 0.26-0.82 at n = 32 and 64, 0.47-1.00 at 96, 0.69-1.11 at 128, up to 1.47 at 192.
#: Complex128 with 64 right-hand sides: 1.3x at n = 32, 2.4x at 128 (LAPACK kept).
SOLVE_KERNEL_REAL_MAX_N = 96

#: ... float32 up to this ``n`` instead (the same work bound). On a 2-vCPU Intel Xeon with
#: AVX-512 (2026-11-26, ``bench.calibrate_cpu`` and a finer sweep, two rounds, kernel / LAPACK):
#: float32 at n = 112 and 128 0.53-1.03 over batch 1 and 100 and 16 to 512 right-hand sides
#: (mostly 0.6-0.9), float64 0.63-1.23 at batch 1 but 0.96-1.49 at batch 100 (kept at 96). In the
#: core grid's harness, 64 right-hand sides at n = 128, float32: 1x128 0.26-0.32 -> 0.16-0.17 ms,
#: 100x128 11.1-11.4 -> 9.2-9.3 ms. (AMD EPYC, 2026-11-25, both dtypes: 0.69-1.11 at 128.) On an AMD
#: EPYC without AVX-512 (2026-11-27, after the kernel's skip became a select and vectorized there, one
#: round each): against MKL, float32 0.68-0.81 at 128 over 64-4096 right-hand sides (batch 1), 0.65-0.70
#: (batch 100), float64 0.85-1.22 at 96; against OpenBLAS, which is 1.2-3.5x faster than MKL there (the
#: LAPACK auto takes on AMD), 64 right-hand sides: float32 0.64 at 96 and 0.94 at 128 (batch 1), 0.87
#: and 1.72 (batch 100), float64 0.89 at 96 (batch 1), 1.34 (batch 100), but 1.1-2.2 from 256
#: right-hand sides at n = 64-128. These limits hold where the LAPACK is MKL; beside OpenBLAS
#: ``SOLVE_KERNEL_OPENBLAS_*`` below.
SOLVE_KERNEL_FLOAT32_MAX_N = 128

#: ... while ``n * nrhs`` stays at or below this: with thousands of right-hand sides
#: LAPACK's BLAS-3 ``trsm`` catches up (batch 1, float64: 0.63-0.88 at n = 96 with 512
#: and 1024, 1.0-1.13 from 2048; n = 64: 0.71-0.82 to 2048, 0.91-0.93 beyond; float32
#: 0.25-0.85 throughout).
SOLVE_KERNEL_REAL_MAX_WORK = 96 * 1024

#: Where the LAPACK is SciPy's OpenBLAS (``LU_CORE_LAPACK=auto`` off Intel's CPUs, or ``scipy``), whose
#: ``getrs`` is faster than MKL's on those CPUs, real systems go to the kernel (past the small limits above)
#: only up to this ``n`` ... Kernel / LAPACK time on a 2-vCPU AMD EPYC (Zen 3, AVX2, no AVX-512),
#: 2026-11-28, the core grid's harness, two sweeps, batch 1 and 100, 8 to 512 right-hand sides:
#: n = 32 0.15-0.86 throughout; n = 64 0.41-0.85 to 128 right-hand sides at batch 1 and 0.64-1.46 at
#: batch 100 (above 1.1 only float32 with 8 and 16), 1.05-1.55 from 256; n = 96 0.55-1.00 to 64 at batch 1,
#: 0.76-1.97 at batch 100 (float32 with 8 to 32 and float64 with 64 above 1.1), 1.09-2.30 from 128;
#: n = 128 float32 0.91-1.54 from 8 right-hand sides at batch 1, 1.02-2.62 at batch 100.
SOLVE_KERNEL_OPENBLAS_MAX_N = 96

#: ... while ``n * nrhs`` stays at or below this (96 x 64, 64 x 128) ...
SOLVE_KERNEL_OPENBLAS_MAX_WORK = 8 * 1024

#: ... or, up to this ``n`` ...
SOLVE_KERNEL_OPENBLAS_SMALL_N = 32

#: ... at or below this (1024 right-hand sides at n = 32). The same machine, one sweep, batch 1 and 100:
#: n = 24 and 32, 512 and 1024 right-hand sides 0.48-1.14 (above 1 only float32 32 x 1024 at batch 100),
#: 2048 and 3072 0.64-1.52 (float64 at batch 1 0.64-0.92, the rest 1.08-1.52). Every limit beside OpenBLAS
#: lies inside MKL's (``backend._solve_by_kernel`` relies on it: a choice inside both needs no LAPACK chosen).
SOLVE_KERNEL_OPENBLAS_SMALL_WORK = 32 * 1024

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

#: Where ``LU_CORE_LAPACK=auto`` keeps SciPy's OpenBLAS (CPUs not Intel's) and MKL is installed on its GNU
#: OpenMP layer, float64 and complex matrices up to this ``max(m, n)`` are factored by MKL's threaded
#: ``getrf`` (``_lapack.Lapack.threaded_factor``); float32, larger matrices, the pooled sizes and every solve
#: stay on OpenBLAS. One matrix, lu_core's whole ``lu_factor``, MKL / OpenBLAS, two processes of each taking
#: turns (2-vCPU AMD EPYC, Zen 3, AVX2, two threads, 2026-11-28): float64 320 1.03-1.09, 384 0.72-0.75,
#: 512 0.59-0.64, 640 0.72-0.73, 768 0.83-0.86, 1024 0.90-0.96, 1536 0.98-1.02, 2048 0.97-1.01; complex128
#: 320 0.69-0.71, 512 0.74-0.80, 1024 0.98-1.02; complex64 320 0.79-0.82, 512 0.75-0.79, 1024 0.96-1.04;
#: float32 0.92-1.16 from 320 to 768, 1.39-1.57 at 1024.
MKL_THREADED_FACTOR_MAX_N = 1024

#: ... from this ``max(m, n)`` (and always past ``LAPACK_POOL_MAX_N``) ... Below it MKL did not win: the same
#: measurement, three processes of each taking turns, float64 257 1.04-1.16, 288 0.94-1.02, 320 0.89-0.99,
#: 352 1.11-1.30, 384 0.82-1.17 (0.72-0.75 in the first measurement); complex128 257 0.92-0.97, 288 0.68-1.19;
#: complex64 257 0.79-1.12, 288 0.92-1.02 (complex at 320 gained, 0.69-0.82: left out for one bound).
MKL_THREADED_FACTOR_MIN_N = 384

#: ... in these dtypes.
MKL_THREADED_FACTOR_DTYPES = ("float64", "complex64", "complex128")

#: Largest ``max(m, n)`` unpacked by the fused per-matrix kernel; larger
#: matrices are split row-parallel so that one big matrix uses every core
#: (fused: 23 vs 27 ms at 100000x8x8, even at 16, 4% slower at 32).
UNPACK_FUSED_MAX_N = 16
