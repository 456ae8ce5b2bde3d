"""Measure the CPU backend's crossovers between its batched kernels and LAPACK.

    python -m bench.calibrate_cpu

For each n, times both paths on the same data (about 2**22 matrix elements per
case) and prints where the kernels stop winning; copy the results into
``lu_core/_cpu/_tuning.py``.
"""

from __future__ import annotations

import sys

import numpy as np

import lu_core
from bench._timing import interleaved
from lu_core._cpu import _tuning

SIZES = [8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384]


def _set(factor: int, solve: int, work: int, unpack: int) -> None:
    _tuning.FACTOR_KERNEL_MAX_N = factor
    _tuning.SOLVE_KERNEL_MAX_N = solve
    _tuning.SOLVE_KERNEL_MAX_WORK = work
    _tuning.SOLVE_KERNEL_ALWAYS_N = min(solve, 16)
    _tuning.UNPACK_FUSED_MAX_N = unpack


def _case(n: int, rng: np.random.Generator) -> list[float]:
    big = 1 << 30
    batch = max(1, (1 << 22) // (n * n))
    A = rng.standard_normal((batch, n, n))
    LU, piv = lu_core.lu_factor(A)
    b1 = rng.standard_normal((batch, n, 1))
    few = batch if n <= 128 else 1
    bn = rng.standard_normal((few, n, n))
    f = interleaved(
        {
            "k": lambda: (_set(big, 0, 0, 0), lu_core.lu_factor(A)),
            "l": lambda: (_set(0, 0, 0, 0), lu_core.lu_factor(A)),
        },
        budget_s=1.0,
    )
    s1 = interleaved(
        {
            "k": lambda: (_set(0, big, big, 0), lu_core.lu_solve(LU, piv, b1)),
            "l": lambda: (_set(0, 0, 0, 0), lu_core.lu_solve(LU, piv, b1)),
        },
        budget_s=1.0,
    )
    sn = interleaved(
        {
            "k": lambda: (_set(0, big, big, 0), lu_core.lu_solve(LU[:few], piv[:few], bn)),
            "l": lambda: (_set(0, 0, 0, 0), lu_core.lu_solve(LU[:few], piv[:few], bn)),
        },
        budget_s=1.0,
    )
    return [batch] + [t["k"].median / t["l"].median for t in (f, s1, sn)]


def main() -> int:
    saved = (
        _tuning.FACTOR_KERNEL_MAX_N,
        _tuning.SOLVE_KERNEL_MAX_N,
        _tuning.SOLVE_KERNEL_MAX_WORK,
        _tuning.UNPACK_FUSED_MAX_N,
    )
    always = _tuning.SOLVE_KERNEL_ALWAYS_N
    rng = np.random.default_rng(0)
    print("| n | batch | factor kernel/LAPACK | solve nrhs=1 kernel/LAPACK | solve nrhs=n kernel/LAPACK |")
    print("|---:|---:|---:|---:|---:|")
    try:
        for n in SIZES:
            batch, *ratios = _case(n, rng)
            print(f"| {n} | {batch} | " + " | ".join(f"{r:.2f}" for r in ratios) + " |", flush=True)
    finally:
        _set(*saved)
        _tuning.SOLVE_KERNEL_ALWAYS_N = always
    print("\nBelow 1: the batched kernel is faster at that size.", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
