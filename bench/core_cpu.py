"""CPU benchmark of lu_core against PyTorch (CPU) and SciPy, same run, as ratios.

    python -m bench.core_cpu [--cases 100000x8 10000x32 ...] [--out bench/results]

float64, the cases of the core issue. Each operation is timed as a user calls it
(from a C-ordered NumPy array or the library's own factorization) with medians
over interleaved rounds. A ratio below 1 means lu_core is faster.
"""

from __future__ import annotations

import argparse
import datetime as dt
import pathlib
import sys

import numpy as np
import scipy.linalg

import lu_core
from bench._timing import interleaved, machine

DEFAULT_CASES = ["100000x8", "10000x32", "100x256", "1x2048"]


def _numpy_unpack(LU: np.ndarray, piv: np.ndarray):
    """The obvious NumPy way (np.tril/np.triu, permutation by a Python loop over k)."""
    m, n = LU.shape[-2:]
    k = min(m, n)
    L = np.tril(LU[..., :, :k], -1) + np.eye(m, k, dtype=LU.dtype)
    U = np.triu(LU[..., :k, :])
    perm = np.broadcast_to(np.arange(m), LU.shape[:-1]).copy()
    rows = np.arange(perm.shape[0]) if perm.ndim > 1 else None
    for i in range(k):
        j = piv[..., i] - 1
        if rows is None:
            perm[[i, j]] = perm[[j, i]]
        else:
            a, b = perm[rows, i].copy(), perm[rows, j].copy()
            perm[rows, i], perm[rows, j] = b, a
    P = np.zeros((*LU.shape[:-2], m, m), dtype=LU.dtype)
    np.put_along_axis(P, perm[..., None, :], 1, axis=-2)
    return P, L, U


def run_case(batch: int, n: int, torch) -> list[dict]:
    rng = np.random.default_rng(0)
    A = rng.standard_normal((batch, n, n))
    B = rng.standard_normal((batch, n, 1))
    LU, piv = lu_core.lu_factor(A)
    rows = []

    def add(op: str, times: dict, peers: list[str]):
        row = {"op": op, "case": f"{batch}x{n}x{n}", "ours": times["lu_core"].median, "spread": times["lu_core"].spread}
        for p in peers:
            row[p] = times[p].median
        rows.append(row)

    # lu_factor
    c = {"lu_core": lambda: lu_core.lu_factor(A), "scipy": lambda: scipy.linalg.lu_factor(A, check_finite=False)}
    if torch is not None:
        At = torch.from_numpy(A)
        c["torch"] = lambda: torch.linalg.lu_factor(At)
    add("lu_factor", interleaved(c), [p for p in ("torch", "scipy") if p in c])

    # lu_solve, one right-hand side per system
    sp_lu = scipy.linalg.lu_factor(A, check_finite=False)
    c = {
        "lu_core": lambda: lu_core.lu_solve(LU, piv, B),
        "scipy": lambda: scipy.linalg.lu_solve(sp_lu, B, check_finite=False),
    }
    if torch is not None:
        LUt, pivt = torch.linalg.lu_factor(At)
        Bt = torch.from_numpy(B)
        c["torch"] = lambda: torch.linalg.lu_solve(LUt, pivt, Bt)
    add("lu_solve", interleaved(c), [p for p in ("torch", "scipy") if p in c])

    # lu_unpack (SciPy has none: the peer is the obvious NumPy code)
    c = {"lu_core": lambda: lu_core.lu_unpack(LU, piv), "numpy": lambda: _numpy_unpack(LU, piv)}
    if torch is not None:
        c["torch"] = lambda: torch.lu_unpack(LUt, pivt)
    add("lu_unpack", interleaved(c), [p for p in ("torch", "numpy") if p in c])

    # solve (factor + solve)
    c = {"lu_core": lambda: lu_core.solve(A, B), "scipy": lambda: scipy.linalg.solve(A, B, check_finite=False)}
    if torch is not None:
        c["torch"] = lambda: torch.linalg.solve(At, Bt)
    add("solve", interleaved(c), [p for p in ("torch", "scipy") if p in c])
    return rows


def render(rows: list[dict], facts: dict[str, str]) -> str:
    lines = [
        f"# lu_core CPU benchmark, {dt.date.today().isoformat()}",
        "",
        "float64; medians over interleaved rounds; ratio = lu_core time / peer time (below 1: lu_core faster).",
        "Peers: PyTorch CPU `torch.linalg`/`torch.lu_unpack`; SciPy `scipy.linalg` (batched by SciPy);"
        " for `lu_unpack`, plain NumPy (`tril`/`triu`/`put_along_axis`), since SciPy has none.",
        "",
        "| op | batch×n×n | lu_core | vs torch | vs scipy / numpy | lu_core spread |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        other = r.get("scipy", r.get("numpy"))
        vt = f"{r['ours'] / r['torch']:.2f}×" if "torch" in r else "n/a"
        vo = f"{r['ours'] / other:.2f}×" if other else "n/a"
        lines.append(f"| {r['op']} | {r['case']} | {r['ours'] * 1e3:.2f} ms | {vt} | {vo} | ±{r['spread'] * 50:.0f}% |")
    lines += ["", "Machine: " + "; ".join(f"{k} {v}" for k, v in facts.items()), ""]
    lines.append("Absolute times are from a shared 2-core machine and are indicative only; the ratios are the result.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", default=DEFAULT_CASES, help="BATCHxN, e.g. 100000x8")
    ap.add_argument("--out", default="bench/results", help="folder for the markdown report ('' for none)")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        torch = None
        print("PyTorch not installed: comparing with SciPy/NumPy only", file=sys.stderr)
    rows: list[dict] = []
    for case in args.cases:
        b, n = (int(x) for x in case.split("x"))
        print(f"case {case} ...", file=sys.stderr, flush=True)
        rows += run_case(b, n, torch)
    report = render(rows, machine())
    print(report)
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{dt.date.today().isoformat()}-core-cpu.md"
        path.write_text(report)
        print(f"written to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
