"""Measure the CPU backend's crossovers: batched kernels against LAPACK, serial twins against parallel ones.

    python -m bench.calibrate_cpu

For each n, times both paths on the same data (about 2**22 matrix elements per
case) and prints where the kernels stop winning; then the solve of one real system
with 8 to 4096 right-hand sides on both paths; then times each kernel's serial
and parallel twin over growing batches and prints the ratio against the total
work (``_tuning.PARALLEL_MIN_WORK`` goes where it crosses 1). Copy the results
into ``lu_core/_cpu/_tuning.py``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import numpy as np

import lu_core
from bench import _timing
from bench.core_cpu import BLOCK_S
from lu_core._cpu import _tuning

SIZES = [8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384]


def interleaved(contenders: dict, budget_s: float, block: int = 3) -> dict[str, _timing.Timing]:
    """The core grid's timing (:func:`bench._timing.interleaved`, its blocks lasting ``BLOCK_S`` at least), so
    that a crossover is measured between calls in their steady state, as the grid compares them: blocks of
    3 calls put calls of microseconds in this VM's wake-up after each pause (``core_cpu``)."""
    return _timing.interleaved(contenders, budget_s=budget_s, block=block, min_block_s=BLOCK_S)


#: The real systems' solve-kernel limits, beside MKL and beside OpenBLAS (``_many_rhs`` moves them together).
_REAL_LIMITS = (
    "SOLVE_KERNEL_REAL_MAX_N",
    "SOLVE_KERNEL_FLOAT32_MAX_N",
    "SOLVE_KERNEL_OPENBLAS_MAX_N",
    "SOLVE_KERNEL_REAL_MAX_WORK",
    "SOLVE_KERNEL_OPENBLAS_MAX_WORK",
    "SOLVE_KERNEL_OPENBLAS_SMALL_WORK",
)
#: Every limit this script overrides (``_set``, ``_many_rhs``).
_LIMITS = ("FACTOR_KERNEL_MAX_N", "SOLVE_KERNEL_MAX_N", "SOLVE_KERNEL_MAX_WORK", "SOLVE_KERNEL_ALWAYS_N")
_LIMITS += ("UNPACK_FUSED_MAX_N", *_REAL_LIMITS)


@contextlib.contextmanager
def _limits_kept() -> Iterator[None]:
    """``_tuning``'s limits as they were, once the block is left however it is left."""
    saved = {name: getattr(_tuning, name) for name in _LIMITS}
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(_tuning, name, value)


def _set_real(n_max: int, work: int) -> None:
    for name in _REAL_LIMITS:
        setattr(_tuning, name, work if name.endswith("WORK") else n_max)


def _set(factor: int, solve: int, work: int, unpack: int) -> None:
    _tuning.FACTOR_KERNEL_MAX_N = factor
    _tuning.SOLVE_KERNEL_MAX_N = solve
    _tuning.SOLVE_KERNEL_MAX_WORK = work
    _tuning.SOLVE_KERNEL_ALWAYS_N = min(solve, 16)
    _set_real(solve, work)
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


def _twins(rng: np.random.Generator) -> None:
    saved = _tuning.PARALLEL_MIN_WORK

    def with_min_work(value: int, fn):
        _tuning.PARALLEL_MIN_WORK = value
        return fn()

    print("\n| n | batch | factor work | factor serial/parallel | solve work | solve serial/parallel |")
    print("|---:|---:|---:|---:|---:|---:|")
    try:
        for n in (8, 32):
            for batch in (16, 64, 256, 1024, 4096):
                A = rng.standard_normal((batch, n, n))
                LU, piv = lu_core.lu_factor(A)
                b = rng.standard_normal((batch, n, 1))
                ratios = []
                for fn in (lambda A=A: lu_core.lu_factor(A), lambda LU=LU, piv=piv, b=b: lu_core.lu_solve(LU, piv, b)):
                    t = interleaved(
                        {"s": lambda fn=fn: with_min_work(1 << 62, fn), "p": lambda fn=fn: with_min_work(0, fn)},
                        budget_s=0.5,
                        block=5,
                    )
                    ratios.append(t["s"].median / t["p"].median)
                print(f"| {n} | {batch} | {batch * n**3} | {ratios[0]:.2f} | {2 * batch * n * n} | {ratios[1]:.2f} |")
    finally:
        _tuning.PARALLEL_MIN_WORK = saved
    print("\nBelow 1: the serial twin is faster at that much work.", file=sys.stderr)


def _factor_dtypes(rng: np.random.Generator) -> None:
    """Kernel / LAPACK factor time per dtype, one matrix and a batch of ~2**21 elements: where
    ``_tuning.FACTOR_KERNEL_MAX_N`` (real) and ``FACTOR_KERNEL_COMPLEX_MAX_N`` go."""
    saved = (_tuning.FACTOR_KERNEL_MAX_N, _tuning.FACTOR_KERNEL_COMPLEX_MAX_N)

    def with_max(n_max: int, fn):
        _tuning.FACTOR_KERNEL_MAX_N = _tuning.FACTOR_KERNEL_COMPLEX_MAX_N = n_max
        return fn()

    sizes = (32, 48, 64, 80, 96, 112, 128)
    print("\n| dtype | batch | " + " | ".join(f"n {n}" for n in sizes) + " |")
    print("|---|---|" + "---:|" * len(sizes))
    try:
        for dtype in (np.float32, np.float64, np.complex64, np.complex128):
            for many in (False, True):
                ratios = []
                for n in sizes:
                    shape = (max(1, (1 << 21) // (n * n)) if many else 1, n, n)
                    A = rng.standard_normal(shape).astype(dtype)
                    if A.dtype.kind == "c":
                        A.imag = rng.standard_normal(shape)
                    factor = lambda A=A: lu_core.lu_factor(A)  # noqa: E731
                    t = interleaved(
                        {"k": lambda f=factor: with_max(1 << 30, f), "l": lambda f=factor: with_max(0, f)},
                        budget_s=0.5,
                    )
                    ratios.append(t["k"].median / t["l"].median)
                label = "~2**21 elements" if many else "1"
                print(f"| {np.dtype(dtype).name} | {label} | " + " | ".join(f"{r:.2f}" for r in ratios) + " |")
    finally:
        _tuning.FACTOR_KERNEL_MAX_N, _tuning.FACTOR_KERNEL_COMPLEX_MAX_N = saved
    print("\nKernel / LAPACK factor time: below 1 the kernel is faster.", file=sys.stderr)


def _many_rhs(rng: np.random.Generator) -> None:
    """Kernel / LAPACK solve time for real dtypes with many right-hand sides (one system): where
    ``_tuning.SOLVE_KERNEL_REAL_MAX_N`` (float64), ``SOLVE_KERNEL_FLOAT32_MAX_N`` and
    ``SOLVE_KERNEL_REAL_MAX_WORK`` go on MKL, ``SOLVE_KERNEL_OPENBLAS_*`` on OpenBLAS (batch 1 only:
    the limits also rest on batch 100, measured by one-off sweeps, ``_tuning``'s docstring)."""

    def with_real(n_max: int, work: int, fn):
        _set_real(n_max, work)
        return fn()

    counts = (8, 64, 256, 1024, 4096)
    print("\n| dtype | n | " + " | ".join(f"nrhs {k}" for k in counts) + " |")
    print("|---|---:|" + "---:|" * len(counts))
    with _limits_kept():
        for dtype in (np.float32, np.float64):
            for n in (32, 64, 96, 128, 192):
                A = rng.standard_normal((1, n, n)).astype(dtype)
                LU, piv = lu_core.lu_factor(A)
                ratios = []
                for k in counts:
                    B = rng.standard_normal((1, n, k)).astype(dtype)
                    solve = lambda LU=LU, piv=piv, B=B: lu_core.lu_solve(LU, piv, B)  # noqa: E731
                    t = interleaved(
                        {
                            "k": lambda solve=solve: with_real(1 << 30, 1 << 62, solve),
                            "l": lambda solve=solve: with_real(0, 0, solve),
                        },
                        budget_s=0.3,
                    )
                    ratios.append(t["k"].median / t["l"].median)
                print(f"| {np.dtype(dtype).name} | {n} | " + " | ".join(f"{r:.2f}" for r in ratios) + " |", flush=True)
    print("\nKernel / LAPACK time for one system: below 1 the kernel is faster.", file=sys.stderr)


def main() -> int:
    rng = np.random.default_rng(0)
    print("| n | batch | factor kernel/LAPACK | solve nrhs=1 kernel/LAPACK | solve nrhs=n kernel/LAPACK |")
    print("|---:|---:|---:|---:|---:|")
    with _limits_kept():
        for n in SIZES:
            batch, *ratios = _case(n, rng)
            print(f"| {n} | {batch} | " + " | ".join(f"{r:.2f}" for r in ratios) + " |", flush=True)
    print("\nBelow 1: the batched kernel is faster at that size.", file=sys.stderr)
    _factor_dtypes(rng)
    _many_rhs(rng)
    _twins(rng)
    return 0


if __name__ == "__main__":
    sys.exit(main())
