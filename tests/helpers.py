"""Shared test data: shapes, dtypes, tolerances, random matrices."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

from lu_core._cpu import _tuning

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]

# (shape of A) covering empty, 1x1, square, tall, wide, batched, both CPU paths.
FACTOR_SHAPES = [
    (0, 0),
    (1, 1),
    (4, 4),
    (7, 3),
    (3, 7),
    (0, 3),
    (3, 0),
    (0, 4, 4),
    (2, 3, 5, 5),
    (3, 6, 4),
    (2, 60, 60),  # past the kernel crossover: LAPACK path
    (70, 52),
    (52, 70),
]

SQUARE_SHAPES = [s for s in FACTOR_SHAPES if s[-1] == s[-2]]


def tol(dtype: type, n: int = 1) -> float:
    eps = np.finfo(np.dtype(dtype)).eps
    return float(eps * 64 * max(n, 1))


def random_matrix(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    a = rng.standard_normal(shape)
    if np.issubdtype(np.dtype(dtype), np.complexfloating):
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


def well_conditioned(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """Random square matrices with a boosted diagonal, so solves are accurate in float32."""
    a = random_matrix(rng, shape, dtype)
    n = shape[-1]
    return (a + 2 * np.sqrt(n) * np.eye(n, dtype=dtype)).astype(dtype)


def assert_close(actual: np.ndarray, expected: np.ndarray, dtype: type, n: int, scale: float | None = None) -> None:
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if actual.size == 0:
        return
    ref = scale if scale is not None else max(1.0, float(np.max(np.abs(expected))))
    err = float(np.max(np.abs(actual - expected)))
    assert err <= tol(dtype, n) * ref, f"max error {err:.3e} > {tol(dtype, n) * ref:.3e}"


@contextlib.contextmanager
def cpu_path(kind: str) -> Iterator[None]:
    """Force the CPU backend onto its batched kernels or onto LAPACK."""
    names = (
        "FACTOR_KERNEL_MAX_N",
        "FACTOR_KERNEL_COMPLEX_MAX_N",
        "SOLVE_KERNEL_MAX_N",
        "SOLVE_KERNEL_MAX_WORK",
        "SOLVE_KERNEL_ALWAYS_N",
        "SOLVE_KERNEL_REAL_MAX_N",
        "SOLVE_KERNEL_FLOAT32_MAX_N",
        "SOLVE_KERNEL_REAL_MAX_WORK",
        "SOLVE_KERNEL_OPENBLAS_MAX_N",
        "SOLVE_KERNEL_OPENBLAS_MAX_WORK",
        "SOLVE_KERNEL_OPENBLAS_SMALL_WORK",
    )
    saved = {name: getattr(_tuning, name) for name in names}
    if kind not in ("kernel", "lapack"):
        raise ValueError(kind)
    for name in names:
        setattr(_tuning, name, 1 << 30 if kind == "kernel" else 0)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(_tuning, name, value)
