"""Where a GPU call's time goes (small calls, and two large batches of small matrices): host work,
waits for the device, device work.

    python -m bench.profile_gpu --out DIR [--seconds S]

The first H200 run (bench/results/2026-11-26-gpu-proof-h200) found lu_core 1.4-8x slower than
torch CUDA on small cases (1x8: lu_factor 82 us against 58 us, lu_solve 193 us against 35 us),
where a call's time is the host's, not the device's. This suite says which part of ours costs
what, for the next device session to act on: per case, ``cupyx.profiler.benchmark``'s host
time (the call, enqueueing included) and device time (CUDA events around it) for lu_core and
torch; then a cProfile of lu_core's calls, the functions with the most time of their own
(host waits for the device show as ``get`` / ``synchronize`` / ``asnumpy`` / copies there).
Writes ``DIR/profile-gpu-<device>.md``. Without a device it says so and exits 0.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pathlib
import pstats
import sys
import time
from collections.abc import Callable

import lu_core
from bench._report import device_slug
from bench.core_gpu import available, device_name, seconds_budget

#: (op, batch, n, dtype): the smallest cases of the core grid, where host work decides, and two large ones.
CASES = (
    ("lu_factor", 1, 8, "float64"),
    ("lu_solve", 1, 8, "float64"),
    ("lu_unpack", 1, 8, "float64"),
    ("solve", 1, 8, "float64"),
    ("lu_factor", 100, 32, "float32"),
    ("lu_solve", 100, 32, "float32"),
    ("lu_solve", 1, 512, "float64"),
    # Large batches of small matrices, where the kernels' throughput decides (the first H200 run:
    # 3.4-5.4x behind PyTorch at 100000 8x8; the kernels now pack several matrices a warp).
    ("lu_factor", 100000, 8, "float64"),
    ("lu_solve", 100000, 8, "float64"),
)
CALLS = 200
TOP = 14


def _calls(op: str, batch: int, n: int, dtype: str, torch) -> tuple[Callable[[], object], Callable[[], object] | None]:
    import cupy

    rng = cupy.random.default_rng(0)
    A = (rng.standard_normal((batch, n, n)) + n**0.5 * cupy.eye(n)).astype(dtype)
    B = rng.standard_normal((batch, n, 1)).astype(dtype)
    LU, piv = lu_core.lu_factor(A)
    ours: dict[str, Callable[[], object]] = {
        "lu_factor": lambda: lu_core.lu_factor(A),
        "lu_solve": lambda: lu_core.lu_solve(LU, piv, B),
        "lu_unpack": lambda: lu_core.lu_unpack(LU, piv),
        "solve": lambda: lu_core.solve(A, B),
    }
    peer = None
    if torch is not None:
        At, Bt = torch.as_tensor(A, device="cuda"), torch.as_tensor(B, device="cuda")
        LUt, pivt = torch.linalg.lu_factor(At)
        peer = {
            "lu_factor": lambda: torch.linalg.lu_factor(At),
            "lu_solve": lambda: torch.linalg.lu_solve(LUt, pivt, Bt),
            "lu_unpack": lambda: torch.lu_unpack(LUt, pivt),
            "solve": lambda: torch.linalg.solve(At, Bt),
        }[op]
    return ours[op], peer


def _host_device_us(fn: Callable[[], object]) -> tuple[float, float]:
    """Median host and device microseconds per call (``cupyx.profiler.benchmark``)."""
    import numpy as np
    from cupyx.profiler import benchmark

    result = benchmark(fn, n_repeat=CALLS, n_warmup=10)
    return float(np.median(result.cpu_times)) * 1e6, float(np.median(result.gpu_times)) * 1e6


def _profile(fn: Callable[[], object]) -> str:
    import cupy

    profiler = cProfile.Profile()
    stream = cupy.cuda.get_current_stream()
    profiler.enable()
    for _ in range(CALLS):
        fn()
        stream.synchronize()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(TOP)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
    return "\n".join(lines[start:])


def measure(
    seconds: float | None, progress: Callable[[str], None], on_case: Callable[[list[dict], dict[str, str]], None]
) -> tuple[list[dict], dict[str, str]]:
    """Every case within ``seconds``; ``on_case`` gets the rows and profiles so far after each (the
    report is rewritten each time, so a run stopped from outside keeps what it measured)."""
    try:
        import torch

        torch = torch if torch.cuda.is_available() else None
    except ImportError:
        torch = None
    start = time.perf_counter()
    rows, profiles = [], {}
    for op, batch, n, dtype in CASES:
        if seconds is not None and time.perf_counter() - start > seconds:
            progress(f"time budget spent: {op} {batch}x{n} {dtype} and after left out")
            break
        ours, peer = _calls(op, batch, n, dtype, torch)
        host, device = _host_device_us(ours)
        row = {"op": op, "batch": batch, "n": n, "dtype": dtype, "host us": host, "device us": device}
        if peer is not None:
            row["torch host us"], row["torch device us"] = _host_device_us(peer)
        rows.append(row)
        key = f"{op} {batch}x{n} {dtype}"
        profiles[key] = _profile(ours)
        progress(f"{key}: {row}")
        on_case(rows, profiles)
    return rows, profiles


def report(device: str, rows: list[dict], profiles: dict[str, str]) -> str:
    head = ["op", "batch", "n", "dtype", "host us", "device us", "torch host us", "torch device us"]
    lines = [
        f"# Where a GPU call's time goes, {device}",
        "",
        f"Command: `python -m bench.profile_gpu --out DIR`. Medians of {CALLS} calls "
        "(`cupyx.profiler.benchmark`: host = the call itself, device = CUDA events around it).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        cells = [str(r[k]) if k in ("op", "batch", "n", "dtype") else f"{r[k]:.1f}" if k in r else "–" for k in head]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"## cProfile of lu_core, {CALLS} calls each (top {TOP} by own time)", ""]
    for key, text in profiles.items():
        lines += [f"### {key}", "", "```", text, "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the report")
    ap.add_argument("--seconds", type=seconds_budget, default=None, help="start no case after this many seconds")
    args = ap.parse_args(argv)
    problem = available()
    if problem is not None:
        print(f"no CUDA device: {problem}; nothing to profile", file=sys.stderr)
        return 0
    device = device_name()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"profile-gpu-{device_slug(device)}.md"

    def write(rows: list[dict], profiles: dict[str, str]) -> None:
        path.write_text(report(device, rows, profiles))

    measure(args.seconds, lambda msg: print(msg, file=sys.stderr, flush=True), write)
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
