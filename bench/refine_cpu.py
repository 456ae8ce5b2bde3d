"""refine-cpu suite: solve_refined, lu_rcond, slogdet on the CPU against their peers, same run, as ratios.

    python -m bench --suite refine-cpu [--quick]

Cases (issue 19's goals):

* one 2048x2048 float64 system, one right-hand side: ``solve_refined`` (float32 LU
  refined to float64) against ``scipy.linalg.solve`` (goal: at least 1.5x faster)
  and our own ``solve``;
* 10000 systems of 16x16, float64, one right-hand side: ``solve_refined`` against
  our ``solve`` (goal: no slower);
* ``lu_rcond`` at n = 1024 against ``lu_factor`` of the same matrix (goal: at most
  a quarter of its time), with SciPy's ``dgecon`` for reference;
* ``slogdet`` against ``numpy.linalg.slogdet`` (no goal; for the record).

Times are medians over interleaved rounds (``bench._timing.interleaved``), so
noise on a shared machine hits every contender alike.
"""

from __future__ import annotations

import datetime as dt
import os
import pathlib
from collections.abc import Callable

import numpy as np
import scipy.linalg
from scipy.linalg import lapack

import lu_core
from bench._timing import interleaved as _interleaved
from bench._timing import machine


def _system(rng: np.random.Generator, batch: tuple[int, ...], n: int) -> tuple[np.ndarray, np.ndarray]:
    A = rng.standard_normal((*batch, n, n)) + np.sqrt(n) * np.eye(n)  # condition ~10: refinement converges
    return A, rng.standard_normal((*batch, n, 1))


def _row(case: str, times: dict, ours: str, peer: str, goal: str, note: str = "") -> dict:
    return {
        "case": case,
        "ours": ours,
        "peer": peer,
        "t_ours": times[ours].median,
        "t_peer": times[peer].median,
        "spread": max(times[ours].spread, times[peer].spread),
        "goal": goal,
        "note": note,
    }


def run_cases(quick: bool, progress: Callable[[str], None]) -> list[dict]:
    rng = np.random.default_rng(0)
    budget = 0.2 if quick else 6.0
    rounds = 3 if quick else 12

    def interleaved(contenders: dict, budget_s: float) -> dict:
        return _interleaved(contenders, budget_s=budget_s, max_rounds=rounds)

    n_big, batch_small, n_rcond = (256, 1000, 128) if quick else (2048, 10000, 1024)
    rows = []

    progress(f"solve_refined, one {n_big}x{n_big} system")
    A, b = _system(rng, (), n_big)
    refined = lu_core.solve_refined(A, b)
    times = interleaved(
        {
            "solve_refined": lambda: lu_core.solve_refined(A, b),
            "scipy.linalg.solve": lambda: scipy.linalg.solve(A, b),
            "lu_core.solve": lambda: lu_core.solve(A, b),
        },
        budget_s=budget,
    )
    note = f"iterations {int(refined.iterations)}, backward error {float(refined.backward_error):.1e}"
    rows.append(_row(f"1 × {n_big}, float64, 1 rhs", times, "solve_refined", "scipy.linalg.solve", "≥ 1.5×", note))
    rows.append(_row(f"1 × {n_big}, float64, 1 rhs", times, "solve_refined", "lu_core.solve", "–", note))

    progress(f"solve_refined, {batch_small} systems of 16x16")
    A, b = _system(rng, (batch_small,), 16)
    refined = lu_core.solve_refined(A, b)
    times = interleaved(
        {"solve_refined": lambda: lu_core.solve_refined(A, b), "lu_core.solve": lambda: lu_core.solve(A, b)},
        budget_s=budget,
    )
    its = refined.iterations
    note = f"iterations {int(its.min())}–{int(its.max())}, max backward error {float(refined.backward_error.max()):.1e}"
    rows.append(_row(f"{batch_small} × 16, float64, 1 rhs", times, "solve_refined", "lu_core.solve", "≥ 1×", note))

    progress(f"lu_rcond at n = {n_rcond}")
    A, _ = _system(rng, (), n_rcond)
    A = rng.standard_normal((n_rcond, n_rcond))
    LU, piv = lu_core.lu_factor(A)
    anorm = float(np.abs(A).sum(axis=0).max())
    lu_f = np.asfortranarray(LU)
    times = interleaved(
        {
            "lu_rcond": lambda: lu_core.lu_rcond(LU, piv, anorm),
            "lu_factor": lambda: lu_core.lu_factor(A),
            "dgecon": lambda: lapack.dgecon(lu_f, anorm),
        },
        budget_s=budget,
    )
    exact = 1 / (anorm * np.abs(np.linalg.inv(A)).sum(axis=0).max())
    note = f"estimate / exact = {float(lu_core.lu_rcond(LU, piv, anorm)) / exact:.3f}"
    rows.append(_row(f"1 × {n_rcond}, float64, 1-norm", times, "lu_rcond", "lu_factor", "≥ 4×", note))
    rows.append(_row(f"1 × {n_rcond}, float64, 1-norm", times, "lu_rcond", "dgecon", "–"))

    progress("slogdet, 10000 x 16x16 and 1 x 1024")
    for batch, n in ((100 if quick else 10000, 16), (1, 128 if quick else 1024)):
        A = rng.standard_normal((batch, n, n))
        times = interleaved(
            {"slogdet": lambda A=A: lu_core.slogdet(A), "numpy.linalg.slogdet": lambda A=A: np.linalg.slogdet(A)},
            budget_s=budget / 2,
        )
        rows.append(_row(f"{batch} × {n}, float64", times, "slogdet", "numpy.linalg.slogdet", "–"))
    return rows


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def render(rows: list[dict], facts: dict[str, str], command: str) -> str:
    lines = [
        f"# Refined solves, condition estimates, determinants on the CPU, {dt.date.today().isoformat()}",
        "",
        f"Command: `{command}`. Speed-up = peer's median / ours (above 1: ours faster), same run, interleaved.",
        "",
        "| case | ours | peer | ours ms | peer ms | speed-up | goal | spread | note |",
        "|---|---|---|---:|---:|---:|---|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['ours']} | {r['peer']} | {_ms(r['t_ours'])} | {_ms(r['t_peer'])} | "
            f"{r['t_peer'] / r['t_ours']:.2f}× | {r['goal']} | ±{r['spread'] * 50:.0f}% | {r['note']} |"
        )
    lines += ["", "## Machine", "", *(f"- {k}: {v}" for k, v in facts.items())]
    return "\n".join(lines)


def run(quick: bool, out: pathlib.Path | None, progress: Callable[[str], None]) -> pathlib.Path | None:
    load_before = os.getloadavg()[0]
    rows = run_cases(quick, progress)
    command = "python -m bench --suite refine-cpu" + (" --quick" if quick else "")
    # The load says whether the machine was quiet: threaded BLAS (the 2048 case) suffers most from sharing.
    facts = {**machine(), "load average (1 min) before / after": f"{load_before:.1f} / {os.getloadavg()[0]:.1f}"}
    report = render(rows, facts, command)
    print(report)
    if out is None:
        return None
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{dt.date.today().isoformat()}-refine-cpu{'-quick' if quick else ''}.md"
    path.write_text(report + "\n")
    progress(f"wrote {path}")
    return path
