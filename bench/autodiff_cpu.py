"""``python -m bench.autodiff_cpu``: ``lu_core.vjp`` against PyTorch's backward on the CPU.

Times the reverse-mode derivatives of ``lu_factor`` and ``lu_solve`` (the gradient
alone: PyTorch's graph is built once and replayed with ``retain_graph=True``) on
a few batch shapes, float64, interleaved (``bench._timing``). Prints a markdown
table; needs PyTorch (no dependency of the project). ``--quick``: one small case.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import lu_core
from bench._timing import interleaved, machine

CASES = [(1000, 8), (200, 32), (8, 128), (1, 512)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.autodiff_cpu", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="one small case, short timings (a smoke test)")
    args = ap.parse_args(argv)
    cases, budget = (CASES[:1], 0.2) if args.quick else (CASES, 2.0)
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: nothing to compare with", file=sys.stderr)
        return 0
    rng = np.random.default_rng(0)
    print(" | ".join(f"{k}={v}" for k, v in machine().items()))
    print("\n| op | batch x n | lu_core.vjp (ms) | torch backward (ms) | ratio |\n|---|---|---|---|---|")
    for batch, n in cases:
        A = rng.standard_normal((batch, n, n)) + np.sqrt(n) * np.eye(n)
        B = rng.standard_normal((batch, n, 2))
        A_t = torch.from_numpy(A).requires_grad_()
        LU_t, piv_t = torch.linalg.lu_factor(A_t)
        LU, piv = LU_t.detach().numpy(), piv_t.numpy()
        g = rng.standard_normal(A.shape)
        g_t = torch.from_numpy(g)
        lu_leaf = LU_t.detach().requires_grad_()
        B_t = torch.from_numpy(B).requires_grad_()
        X_t = torch.linalg.lu_solve(lu_leaf, piv_t, B_t)
        X = X_t.detach().numpy()
        gX = rng.standard_normal(X.shape)
        gX_t = torch.from_numpy(gX)
        cases = {
            "lu_factor": {
                "ours": lambda LU=LU, piv=piv, g=g: lu_core.vjp.lu_factor(LU, piv, g),
                "torch": lambda LU_t=LU_t, A_t=A_t, g_t=g_t: torch.autograd.grad(LU_t, A_t, g_t, retain_graph=True),
            },
            "lu_solve": {
                "ours": lambda LU=LU, piv=piv, B=B, X=X, gX=gX: lu_core.vjp.lu_solve(LU, piv, B, X, gX),
                "torch": lambda X_t=X_t, ins=(lu_leaf, B_t), gX_t=gX_t: torch.autograd.grad(
                    X_t, ins, gX_t, retain_graph=True
                ),
            },
        }
        for op, contenders in cases.items():
            t = interleaved(contenders, budget_s=budget, max_rounds=3 if args.quick else 12)
            ours, theirs = t["ours"].median * 1e3, t["torch"].median * 1e3
            print(f"| {op} | {batch} x {n} | {ours:.3f} | {theirs:.3f} | {ours / theirs:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
