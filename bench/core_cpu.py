"""core-cpu suite: lu_core against PyTorch (CPU) and SciPy on the same machine, same run, as ratios.

    python -m bench --suite core-cpu [--quick]          (or python -m bench.core_cpu)

Grid: batch 1 ... 100000 and n 8 ... 2048 (cases above 2^24 elements left out),
float32 and float64, the four operations. Each operation is timed as a user calls
it (from a C-ordered NumPy array or the library's own factorization), with medians
and spreads over interleaved rounds. A ratio below 1 means lu_core is faster.
"""

from __future__ import annotations

import argparse
import datetime as dt
import pathlib
import sys
from collections.abc import Callable

import numpy as np
import scipy.linalg

import lu_core
from bench._report import ratio_table, write
from bench._timing import interleaved, machine

GRID_N = (8, 32, 128, 512, 2048)
GRID_BATCH = (1, 100, 10000, 100000)
QUICK_N = (8, 32)
QUICK_BATCH = (1, 100)
MAX_ELEMENTS = 1 << 24  # 128 MiB of float64 per operand
DTYPES = ("float32", "float64")
PEERS = ("torch", "scipy", "numpy")


def cases(quick: bool) -> list[tuple[int, int]]:
    ns, batches = (QUICK_N, QUICK_BATCH) if quick else (GRID_N, GRID_BATCH)
    return [(b, n) for n in ns for b in batches if b * n * n <= MAX_ELEMENTS]


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


def run_case(batch: int, n: int, dtype: str, torch, budget_s: float = 1.5) -> list[dict]:
    rng = np.random.default_rng(0)
    A = (rng.standard_normal((batch, n, n)) + n**0.5 * np.eye(n)).astype(dtype)
    B = rng.standard_normal((batch, n, 1)).astype(dtype)
    LU, piv = lu_core.lu_factor(A)
    rows = []

    def time_op(op: str, contenders: dict[str, Callable[[], object]]) -> None:
        # Blocks of 5 after a 50 ms pause: PyTorch's OpenMP threads spin for a while after its calls,
        # and a contender timed right after them would pay for it.
        times = interleaved(contenders, budget_s=budget_s, max_rounds=8, block=5, pause=0.05)
        row = {"op": op, "dtype": dtype, "batch": batch, "n": n}
        row.update(ours=times["lu_core"].median, spread=times["lu_core"].spread)
        row.update({p: times[p].median for p in PEERS if p in times})
        rows.append(row)

    At = torch.from_numpy(A) if torch is not None else None
    c = {"lu_core": lambda: lu_core.lu_factor(A), "scipy": lambda: scipy.linalg.lu_factor(A, check_finite=False)}
    if torch is not None:
        c["torch"] = lambda: torch.linalg.lu_factor(At)
    time_op("lu_factor", c)

    # SciPy has no unpack of a packed factorization: the peer is the obvious NumPy code.
    c = {"lu_core": lambda: lu_core.lu_unpack(LU, piv), "numpy": lambda: _numpy_unpack(LU, piv)}
    if torch is not None:
        LUt, pivt = torch.linalg.lu_factor(At)
        c["torch"] = lambda: torch.lu_unpack(LUt, pivt)
    time_op("lu_unpack", c)

    sp_lu = scipy.linalg.lu_factor(A, check_finite=False)
    c = {
        "lu_core": lambda: lu_core.lu_solve(LU, piv, B),
        "scipy": lambda: scipy.linalg.lu_solve(sp_lu, B, check_finite=False),
    }
    if torch is not None:
        Bt = torch.from_numpy(B)
        c["torch"] = lambda: torch.linalg.lu_solve(LUt, pivt, Bt)
    time_op("lu_solve", c)

    c = {"lu_core": lambda: lu_core.solve(A, B), "scipy": lambda: scipy.linalg.solve(A, B, check_finite=False)}
    if torch is not None:
        c["torch"] = lambda: torch.linalg.solve(At, Bt)
    time_op("solve", c)
    return rows


def render(rows: list[dict], facts: dict[str, str], command: str) -> str:
    lines = [
        f"# lu_core CPU benchmark, {dt.date.today().isoformat()}",
        "",
        f"Command: `{command}`. Medians over interleaved rounds of each contender (blocks of 5 calls, order",
        "rotated every round); `spread` is lu_core's interquartile range over its median; ratio = lu_core",
        "time / peer time (below 1: lu_core faster). Peers: PyTorch CPU (`torch.linalg`, `torch.lu_unpack`),",
        "SciPy (`scipy.linalg`, batched by SciPy) and, for `lu_unpack`, which SciPy lacks, plain NumPy",
        "(`tril`/`triu`/`put_along_axis`). One right-hand side per system.",
        "",
        ratio_table(rows, PEERS),
        "",
        "## Machine",
        "",
        *[f"- {k}: {v}" for k, v in facts.items()],
        "",
        "Absolute times are from the machine above and are indicative only; the ratios, measured in the",
        "same run, are the result.",
    ]
    return "\n".join(lines) + "\n"


def run(quick: bool, out: pathlib.Path | None, progress: Callable[[str], None]) -> pathlib.Path | None:
    try:
        import torch
    except ImportError:
        torch = None
        progress("PyTorch not installed: comparing with SciPy and NumPy only")
    todo = [(b, n, d) for d in DTYPES for (b, n) in cases(quick)]
    rows: list[dict] = []
    for i, (b, n, d) in enumerate(todo, 1):
        progress(f"{i}/{len(todo)}: {d} batch {b} n {n}")
        rows += run_case(b, n, d, torch, budget_s=0.3 if quick else 1.5)
    command = "python -m bench --suite core-cpu" + (" --quick" if quick else "")
    report = render(rows, machine(), command)
    print(report)
    if out is None:
        return None
    path = write(
        report, rows, PEERS, out / f"{dt.date.today().isoformat()}-cpu{'-quick' if quick else ''}", "lu_core on the CPU"
    )
    progress(f"wrote {path} and its plots")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a small grid and short timings (a smoke test)")
    ap.add_argument("--out", default="bench/results", help="folder for the report and plots ('' for none)")
    args = ap.parse_args(argv)
    run(args.quick, pathlib.Path(args.out) if args.out else None, lambda m: print(f"[core-cpu] {m}", file=sys.stderr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
