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
Then the first large solve in a fresh process (``first_call``): on the H100 the service's first
5792 x 5792 ``/lu_solve`` spent 6.3 s in compute after a warm-up that had reached cuSOLVER
``getrs`` at n = 64 (2.7 ms the second time). Two fresh processes in turn (the same caches as the
service) each do what the warm-up does, upload a C-ordered LU as a request's, and time the first
and second ``lu_solve`` of it, the first under cProfile: a cost the second process pays too is
per process (a library or module loaded), one it does not is a cache on disk (NVRTC, PTX JIT).
Writes ``DIR/profile-gpu-<device>.md``. Without a device it says so and exits 0.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pathlib
import pstats
import subprocess
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
#: The first large solve: the order of the H100 service run's 256 MiB float64 LU, and the seconds a
#: fresh process may take for it (import, warm-up, upload, two solves).
FIRST_CALL_N = 5792
FIRST_CALL_TIMEOUT_S = 30


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


def first_call_child(n: int) -> dict:
    """In a fresh process: the service's warm-up for the library paths (device arrays, n = 64), then a
    request's C-ordered ``n x n`` float64 LU uploaded and solved twice; seconds per stage, and a
    cProfile (by cumulative time) of the first solve."""
    t0 = time.perf_counter()
    import cupy
    import numpy as np

    stream = cupy.cuda.get_current_stream()
    times: dict[str, float] = {"import s": time.perf_counter() - t0}

    def timed(key: str, fn: Callable[[], object]) -> object:
        start = time.perf_counter()
        out = fn()
        stream.synchronize()
        times[key] = time.perf_counter() - start
        return out

    def warm_up() -> None:
        rng = np.random.default_rng(0)
        for batch, k in ((1, 64), (4, 64)):  # service.app.WARMUP_SHAPES' library shapes
            A = cupy.asarray(rng.standard_normal((batch, k, k)) + k * np.eye(k))
            LU, piv = lu_core.lu_factor(A)
            lu_core.lu_solve(LU, piv, cupy.asarray(rng.standard_normal((batch, k, 1))))

    timed("warm-up s", warm_up)
    rng = np.random.default_rng(1)
    # A request's LU: C-ordered host memory, a well-conditioned unit-lower / upper pair, identity pivots.
    LU = np.tril(rng.standard_normal((n, n)), -1) / n + np.triu(rng.standard_normal((n, n)), 1) / n + 2 * np.eye(n)
    piv = np.arange(1, n + 1, dtype=np.int32)
    B = rng.standard_normal((n, 1))
    LUd, pivd, Bd = timed("upload s", lambda: (cupy.asarray(LU), cupy.asarray(piv), cupy.asarray(B)))
    profiler = cProfile.Profile()
    profiler.enable()
    timed("first lu_solve s", lambda: lu_core.lu_solve(LUd, pivd, Bd))
    profiler.disable()
    timed("second lu_solve s", lambda: lu_core.lu_solve(LUd, pivd, Bd))
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(TOP)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
    return {"times": times, "profile": "\n".join(lines[start:])}


def first_call(n: int = FIRST_CALL_N, runs: int = 2) -> list[dict]:
    """``first_call_child`` in ``runs`` fresh processes one after the other (each result, or its error)."""
    results = []
    for _ in range(runs):
        argv = [sys.executable, "-m", "bench.profile_gpu", "--first-call-child", str(n)]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=FIRST_CALL_TIMEOUT_S, env=os.environ)
        except subprocess.TimeoutExpired:
            results.append({"error": f"no answer in {FIRST_CALL_TIMEOUT_S} s"})
            continue
        if done.returncode != 0:
            results.append({"error": f"exit {done.returncode}: {done.stderr.strip()[-600:]}"})
            continue
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


def report(device: str, rows: list[dict], profiles: dict[str, str], first: list[dict] | None = None) -> str:
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
    if first:
        title = f"## The first {FIRST_CALL_N} x {FIRST_CALL_N} float64 lu_solve in a fresh process"
        lines += [title, "", "Each run a new process, one after the other (the service's caches); seconds.", ""]
        keys = ["import s", "warm-up s", "upload s", "first lu_solve s", "second lu_solve s"]
        lines += ["| process | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
        for i, r in enumerate(first, 1):
            if "error" in r:
                lines.append(f"| {i} | " + " | ".join(["–"] * (len(keys) - 1)) + f" | {r['error']} |")
            else:
                lines.append(f"| {i} | " + " | ".join(f"{r['times'][k]:.3f}" for k in keys) + " |")
        for i, r in enumerate(first, 1):
            if "profile" in r:
                lines += ["", f"### Process {i}: cProfile of the first lu_solve (top {TOP} by cumulative time)", "",
                          "```", r["profile"], "```"]  # fmt: skip
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the report")
    ap.add_argument("--seconds", type=seconds_budget, default=None, help="start no case after this many seconds")
    ap.add_argument("--first-call-child", type=int, default=None, help=argparse.SUPPRESS)  # first_call's processes
    args = ap.parse_args(argv)
    if args.first_call_child is not None:
        print(json.dumps(first_call_child(args.first_call_child)))
        return 0
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

    rows, profiles = measure(args.seconds, lambda msg: print(msg, file=sys.stderr, flush=True), write)
    first = first_call()
    print(f"first {FIRST_CALL_N} lu_solve in fresh processes: {[r.get('times', r) for r in first]}", file=sys.stderr)
    path.write_text(report(device, rows, profiles, first))
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
