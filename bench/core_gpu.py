"""core-gpu suite: lu_core (CuPy) against torch.linalg (CUDA) and cupyx.scipy.linalg, on one GPU.

    python -m bench --suite core-gpu [--quick]
    python -m bench.core_gpu --out DIR [--quick] [--seconds S]   # S: a time budget (make gpu-proof)

Runs only where CuPy sees a GPU. Grid: batch 1 ... 100000, n 8 ... 8192 (cases
above 2^26 elements left out), float32 and float64. Every contender is timed with
CUDA events on the current stream after warm-up, medians over repeats. Also
reported: lu_solve with 64 right-hand sides (up to 2^26 elements of B), achieved
memory bandwidth of lu_unpack (bytes of LU and pivots read plus P, L, U written,
over the time) and achieved FLOP/s of lu_factor (2/3 n^3 per matrix). cupyx has no
batched lu_factor: it is timed as a Python loop over the batch where the batch is
at most 1000, and left out above. Before the grid: lu_factor of rectangular
batches (``RECT_CASES``), which PyTorch and the libraries factor a matrix at a time.

Status: written without a GPU to run it on (see the README); expect fixes on first
contact with a device.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import pathlib
import statistics
import sys
import time
from collections.abc import Callable

import lu_core
from bench._report import device_slug, ratio_table, write

GRID_N = (8, 32, 128, 512, 2048, 8192)
GRID_BATCH = (1, 100, 10000, 100000)
QUICK_N = (8, 128)
QUICK_BATCH = (1, 1000)
MAX_ELEMENTS = 1 << 26
DTYPES = ("float32", "float64")
PEERS = ("torch", "cupyx")
CUPYX_MAX_BATCH = 1000
#: Rectangular batches (batch, m, n), measured before the square grid: tall and wide ones our kernel takes.
RECT_CASES = ((1000, 100, 20), (1000, 20, 100), (10000, 64, 32), (1000, 127, 96))


def device_name() -> str:
    """The current CUDA device's name (CuPy reports bytes or str, by version)."""
    import cupy

    raw = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def available() -> str | None:
    """None when a GPU is usable, else why not."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CUDA sees no device"
    except Exception as exc:
        return f"CUDA is not usable ({exc})"
    return None


def _cuda_time(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    import cupy

    for _ in range(2):
        fn()
    cupy.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(repeats):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    med = statistics.median(times)
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [med] * 3
    return med, (q[2] - q[0]) / med if med else 0.0


def run_case(batch: int, n: int, dtype: str, torch, repeats: int) -> list[dict]:
    import cupy
    import cupyx.scipy.linalg as cxl

    rng = cupy.random.default_rng(0)
    A = (rng.standard_normal((batch, n, n)) + n**0.5 * cupy.eye(n)).astype(dtype)
    B = rng.standard_normal((batch, n, 1)).astype(dtype)
    LU, piv = lu_core.lu_factor(A)
    rows = []
    At = Bt = LUt = pivt = None
    if torch is not None:
        At, Bt = torch.as_tensor(A, device="cuda"), torch.as_tensor(B, device="cuda")
        LUt, pivt = torch.linalg.lu_factor(At)

    def time_op(op: str, ours: Callable[[], object], peers: dict[str, Callable[[], object] | None], **extra) -> None:
        med, spread = _cuda_time(ours, repeats)
        row = {"op": op, "dtype": dtype, "batch": batch, "n": n, "ours": med, "spread": spread, **extra}
        for name, fn in peers.items():
            if fn is not None:
                row[name] = _cuda_time(fn, repeats)[0]
        rows.append(row)

    loop_ok = batch <= CUPYX_MAX_BATCH
    itemsize = A.dtype.itemsize
    flops = batch * (2 / 3) * n**3
    time_op(
        "lu_factor",
        lambda: lu_core.lu_factor(A),
        {
            "torch": (lambda: torch.linalg.lu_factor(At)) if torch is not None else None,
            "cupyx": (lambda: [cxl.lu_factor(A[i], check_finite=False) for i in range(batch)]) if loop_ok else None,
        },
    )
    rows[-1]["GFLOP/s"] = flops / rows[-1]["ours"] / 1e9
    moved = batch * (n * n * itemsize + n * 4 + 3 * n * n * itemsize)
    time_op(
        "lu_unpack",
        lambda: lu_core.lu_unpack(LU, piv),
        {"torch": (lambda: torch.lu_unpack(LUt, pivt)) if torch is not None else None},
    )
    rows[-1]["GB/s"] = moved / rows[-1]["ours"] / 1e9
    cx_factors = [cxl.lu_factor(A[i], check_finite=False) for i in range(batch)] if loop_ok else None
    time_op(
        "lu_solve",
        lambda: lu_core.lu_solve(LU, piv, B),
        {
            "torch": (lambda: torch.linalg.lu_solve(LUt, pivt, Bt)) if torch is not None else None,
            "cupyx": (lambda: [cxl.lu_solve(f, B[i]) for i, f in enumerate(cx_factors)]) if loop_ok else None,
        },
    )
    if batch * n * 64 <= MAX_ELEMENTS:
        B64 = rng.standard_normal((batch, n, 64)).astype(dtype)
        B64t = torch.as_tensor(B64, device="cuda") if torch is not None else None
        time_op(
            "lu_solve 64 rhs",
            lambda: lu_core.lu_solve(LU, piv, B64),
            {"torch": (lambda: torch.linalg.lu_solve(LUt, pivt, B64t)) if torch is not None else None},
        )
    time_op(
        "solve",
        lambda: lu_core.solve(A, B),
        {"torch": (lambda: torch.linalg.solve(At, Bt)) if torch is not None else None},
    )
    return rows


def run_rectangular(batch: int, m: int, n: int, dtype: str, torch, repeats: int) -> dict:
    """lu_factor of a batch of m x n matrices (our small-matrix kernel where one fits in shared memory;
    the libraries need a call per matrix) against torch and a cupyx loop."""
    import cupy
    import cupyx.scipy.linalg as cxl

    A = cupy.random.default_rng(0).standard_normal((batch, m, n)).astype(dtype)
    med, spread = _cuda_time(lambda: lu_core.lu_factor(A), repeats)
    row = {"op": "lu_factor", "dtype": dtype, "batch": batch, "n": f"{m}×{n}", "ours": med, "spread": spread}
    if torch is not None:
        At = torch.as_tensor(A, device="cuda")
        row["torch"] = _cuda_time(lambda: torch.linalg.lu_factor(At), repeats)[0]
    if batch <= CUPYX_MAX_BATCH:
        row["cupyx"] = _cuda_time(lambda: [cxl.lu_factor(A[i], check_finite=False) for i in range(batch)], repeats)[0]
    return row


def cases(quick: bool) -> list[tuple[int, int]]:
    ns, batches = (QUICK_N, QUICK_BATCH) if quick else (GRID_N, GRID_BATCH)
    return [(b, n) for n in ns for b in batches if b * n * n <= MAX_ELEMENTS]


def in_order(todo: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Cheapest first (by a factorization's work, batch x n^3, then float32 before float64), so that a
    time budget cuts the most expensive cells, not a whole range of sizes."""
    return sorted(todo, key=lambda c: (c[0] * c[1] ** 3, c[2] != "float32", c[1]))


def seconds_budget(text: str) -> float:
    """``--seconds``: a finite number of seconds above zero (argparse type; a clear error otherwise)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the time budget must be a finite number of seconds above 0")
    return value


def within(seconds: float | None, start: float) -> Callable[[], bool]:
    """Whether there is time left for another case (None: no budget)."""
    return lambda: seconds is None or time.perf_counter() - start < seconds


def run(
    quick: bool, out: pathlib.Path | None, progress: Callable[[str], None], seconds: float | None = None
) -> pathlib.Path | None:
    """The suite; ``seconds``: start no case past this budget (the report says which were left out)."""
    start = time.perf_counter()
    more = within(seconds, start)
    why = available()
    if why is not None:
        progress(f"skipped: {why}")
        return None
    import cupy

    try:
        import torch

        if not torch.cuda.is_available():
            torch = None
    except ImportError:
        torch = None
    if torch is None:
        progress("PyTorch with CUDA not available: comparing with cupyx only")
    repeats = 5 if quick else 15
    rect_rows = [  # (few repeats: the peers' loops take ~1000 library calls each)
        run_rectangular(b, m, n, d, torch, 5) for b, m, n in RECT_CASES[: 1 if quick else None] for d in DTYPES
    ]
    todo = in_order([(b, n, d) for d in DTYPES for (b, n) in cases(quick)])
    rows: list[dict] = []
    done = 0
    for i, (b, n, d) in enumerate(todo, 1):
        if not more():
            break
        progress(f"{i}/{len(todo)}: {d} batch {b} n {n}")
        rows += run_case(b, n, d, torch, repeats=repeats)
        done = i
    left = [f"{d} {b}x{n}" for b, n, d in todo[done:]]
    budget = (
        f"Stopped by the time budget ({seconds:.0f} s) after {done} of {len(todo)} cases; left out: {', '.join(left)}."
        if left
        else f"All {len(todo)} cases."
    )
    name = device_name()
    extra = [
        f"| {r['op']} | {r['dtype']} | {r['batch']} | {r['n']} | "
        + (f"{r['GFLOP/s']:.1f} GFLOP/s" if "GFLOP/s" in r else f"{r['GB/s']:.1f} GB/s")
        + " |"
        for r in rows
        if "GFLOP/s" in r or "GB/s" in r
    ]
    report = "\n".join(
        [
            f"# lu_core GPU benchmark, {dt.date.today().isoformat()}",
            "",
            f"Device: {name}; CuPy {cupy.__version__}; torch {getattr(torch, '__version__', 'not available')}.",
            "Times: CUDA events after warm-up, medians; ratio = lu_core / peer (below 1: lu_core faster).",
            budget,
            "",
            ratio_table(rows, PEERS),
            "",
            "Rectangular batches (n: rows × columns):",
            "",
            ratio_table(rect_rows, PEERS),
            "",
            "| op | dtype | batch | n | achieved |",
            "|---|---|---|---|---:|",
            *extra,
            "",
        ]
    )
    print(report)
    if out is None:
        return None
    path = write(
        report,
        rows,
        PEERS,
        out / f"{dt.date.today().isoformat()}-gpu-{device_slug(name)}{'-quick' if quick else ''}",
        f"lu_core on {name}",
    )
    progress(f"wrote {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.core_gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results", help="folder for the report ('' for none)")
    ap.add_argument("--quick", action="store_true", help="a small grid (a smoke test)")
    ap.add_argument("--seconds", type=seconds_budget, default=None, help="start no case after this many seconds")
    args = ap.parse_args(argv)
    out = pathlib.Path(args.out) if args.out else None
    run(args.quick, out, lambda msg: print(f"[core-gpu] {msg}", file=sys.stderr, flush=True), args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
