"""``python -m lu_core``: a worked example that exercises every public function.

Prints which backend ran and checks each result, exiting non-zero if a check
fails, so it doubles as a smoke test of an installation.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import lu_core


def main() -> int:
    rng = np.random.default_rng(0)
    A = rng.standard_normal((1000, 16, 16))
    B = rng.standard_normal((1000, 16, 4))

    t0 = time.perf_counter()
    LU, piv = lu_core.lu_factor(A)
    P, L, U = lu_core.lu_unpack(LU, piv)
    X = lu_core.lu_solve(LU, piv, B)
    Xa = lu_core.lu_solve(LU, piv, B, adjoint=True)
    elapsed = time.perf_counter() - t0

    checks = {
        "P @ L @ U == A": np.allclose(P @ L @ U, A),
        "A @ X == B": np.allclose(A @ X, B),
        "A^H @ X == B (adjoint)": np.allclose(A.swapaxes(-1, -2) @ Xa, B),
        "solve == lu_solve": np.allclose(lu_core.solve(A, B), X),
        "A[perm] == L @ U": np.allclose(
            np.take_along_axis(A, lu_core.pivots_to_permutation(piv, 16)[..., None], axis=-2), L @ U
        ),
    }
    print(f"lu_core {lu_core.__version__} on the CPU: 1000 systems of 16x16, 4 right-hand sides")
    print(f"factor + unpack + solve + adjoint solve: {elapsed * 1e3:.1f} ms (first call includes JIT warm-up)")
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    try:
        lu_core.lu_factor(np.zeros((2, 3, 3)))
    except lu_core.SingularMatrixError as exc:
        print(f"  ok   singular input raises: {exc}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
