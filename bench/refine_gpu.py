"""refine-gpu suite: solve_refined on one GPU against torch.linalg.solve (CUDA, float64).

    python -m bench --suite refine-gpu [--quick]

Issue 19's GPU goal: n = 8192 and 16384, float64, one right-hand side,
``solve_refined`` with the default factor dtype (float32), ``"tf32"`` and
``"float16"`` (cuSOLVER IRS through nvmath-python) at least 2x faster than
``torch.linalg.solve`` with a backward error at most 10x PyTorch's. Times are
CUDA events after warm-up, medians. The report is named
``<date>-refine-gpu-<device>.md``. Skips (exit 0) where no GPU is visible.

Status: written without a GPU to run it on; expect fixes on first contact with a device.
"""

from __future__ import annotations

import datetime as dt
import pathlib
import re
from collections.abc import Callable

import lu_core
from bench.core_gpu import _cuda_time, available, device_name

SIZES = (8192, 16384)
QUICK_SIZES = (1024,)
FACTORS = (None, "tf32", "float16")


def _backward_error(cp, A, x, b) -> float:
    r = b - A @ x
    den = cp.abs(A).sum(axis=1).max() * cp.abs(x).max() + cp.abs(b).max()
    return float(cp.abs(r).max() / den)


def run(quick: bool, out: pathlib.Path | None, progress: Callable[[str], None]) -> pathlib.Path | None:
    why = available()
    if why is not None:
        progress(f"skipped: {why}")
        return None
    import cupy as cp

    try:
        import torch

        torch = torch if torch.cuda.is_available() else None
    except ImportError:
        torch = None
    device = device_name()
    rows = []
    for n in QUICK_SIZES if quick else SIZES:
        rng = cp.random.default_rng(0)
        A = rng.standard_normal((n, n)) + cp.sqrt(n) * cp.eye(n)
        b = rng.standard_normal((n, 1))
        peer_t, peer_err = None, None
        if torch is not None:
            At, bt = torch.as_tensor(A, device="cuda"), torch.as_tensor(b, device="cuda")
            peer_t, _ = _cuda_time(lambda At=At, bt=bt: torch.linalg.solve(At, bt), 3 if quick else 10)
            peer_err = _backward_error(cp, A, cp.asarray(torch.linalg.solve(At, bt)), b)
        for factor in FACTORS:
            progress(f"n {n}, factor_dtype {factor}")
            try:
                _, it, berr = lu_core.solve_refined(A, b, factor_dtype=factor)
                t, spread = _cuda_time(
                    lambda A=A, b=b, f=factor: lu_core.solve_refined(A, b, factor_dtype=f), 3 if quick else 10
                )
            except Exception as exc:  # a first run on a device: record, do not stop the proof
                rows.append(f"| {n} | {factor or 'float32 (default)'} | failed: {type(exc).__name__}: {exc} |||||")
                continue
            speed = f"{peer_t / t:.2f}×" if peer_t else "–"
            ratio = f"{float(berr) / peer_err:.2f}" if peer_err else "–"
            rows.append(
                f"| {n} | {factor or 'float32 (default)'} | {t * 1e3:.2f} ms ±{spread * 50:.0f}% | "
                f"{peer_t * 1e3 if peer_t else float('nan'):.2f} ms | {speed} | {int(it)} | "
                f"{float(berr):.1e} | {ratio} |"
            )
    report = "\n".join(
        [
            f"# solve_refined on the GPU, {dt.date.today().isoformat()}",
            "",
            f"Device: {device}; CuPy {cp.__version__}; torch {getattr(torch, '__version__', 'not available')}.",
            "Goal: speed-up over torch.linalg.solve (float64) ≥ 2×, backward error ≤ 10× PyTorch's.",
            "",
            "| n | factor_dtype | solve_refined | torch.linalg.solve | speed-up | iterations | backward error | "
            "/ torch's |",
            "|---:|---|---:|---:|---:|---:|---:|---:|",
            *rows,
        ]
    )
    print(report)
    if out is None:
        return None
    out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    path = out / f"{dt.date.today().isoformat()}-refine-gpu-{slug}{'-quick' if quick else ''}.md"
    path.write_text(report + "\n")
    progress(f"wrote {path}")
    return path
