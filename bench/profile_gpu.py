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
``getrs`` at n = 64 (2.7 ms the second time). Two fresh processes in turn each do what the warm-up
does, upload a C-ordered LU as a request's, and time the first and second ``lu_solve`` of it, the
first under cProfile; they share a new, empty CUDA JIT cache. How to read which of them pays what:
``FIRST_CALL_READING``.
Writes ``DIR/profile-gpu-<device>.md``. Without a device it says so and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pathlib
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

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
#: The same calls with the GPU backend's short paths off (``solve_direct`` for ``lu_solve``, ``solve_fused``
#: for ``solve``, ``unpack_direct`` for ``lu_unpack``: the general path), measured in the same run: what the
#: short paths save, on the device (the H100 on 2026-11-27: lu_solve 113 us against 217, solve 134 against
#: 290; ``unpack_direct`` not yet run on a device).
GENERAL_PATH_CASES = (("lu_solve", 1, 8, "float64"), ("solve", 1, 8, "float64"), ("lu_unpack", 1, 8, "float64"))
SHORT_PATHS = ("solve_direct", "solve_fused", "unpack_direct")
CALLS = 200
TOP = 14
#: The first large solve: the order of the H100 service run's 256 MiB float64 LU, and the seconds a
#: fresh process may take for it (import, warm-up, upload, two solves).
FIRST_CALL_N = 5792
FIRST_CALL_TIMEOUT_S = 30
FIRST_CALL_TOP = 30


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
    return _table(profiler, "tottime", TOP)


def _table(profiler: cProfile.Profile, key: str, top: int) -> str:
    """The profile's ``top`` rows by ``key``, from the column heads on (pstats' preamble dropped)."""
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats(key).print_stats(top)
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
    for op, batch, n, dtype in GENERAL_PATH_CASES:
        if seconds is not None and time.perf_counter() - start > seconds:
            break
        ours, _ = _calls(op, batch, n, dtype, None)
        with _general_path():
            host, device = _host_device_us(ours)
        rows.append(
            {"op": f"{op} (general path)", "batch": batch, "n": n, "dtype": dtype, "host us": host, "device us": device}
        )
        progress(f"{op} {batch}x{n} {dtype} (general path): {rows[-1]}")
        on_case(rows, profiles)
    return rows, profiles


@contextlib.contextmanager
def _general_path() -> Iterator[None]:
    """The GPU backend's short paths (``SHORT_PATHS``) off: every call takes the general path."""
    from lu_core._gpu.backend import GpuBackend

    saved = {name: getattr(GpuBackend, name) for name in SHORT_PATHS}
    for name in SHORT_PATHS:
        setattr(GpuBackend, name, lambda self, *args, **kwargs: None)
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(GpuBackend, name, method)


#: The warm-up's shapes that reach the libraries (``service.app.WARMUP_SHAPES`` with n > 32; a test
#: keeps them equal), for the fresh processes of :func:`first_call` (batch None: one matrix, 2-D).
WARMUP_LIBRARY_SHAPES = ((1, 64), (4, 64), (4, 160), (None, 64))
#: How to read the first-call table (the report says it).
FIRST_CALL_READING = (
    "Seconds per stage, each process new, one after the other, sharing a new, empty CUDA JIT cache "
    "(`CUDA_CACHE_PATH`) and the usual CuPy kernel cache. A first solve slow in both processes: a cost "
    "per process (a library or module loaded); in the first only: something compiled and cached on disk "
    "(CuPy's NVRTC into its kernel cache, more likely than the driver's PTX JIT: the cProfile shows which); "
    "in neither: cached already (the proof's service part ran the same solve before) or a cost of the "
    "service's own path (its streams, pinned staging), which these processes do not take."
)
#: How a fresh process's lines on stdout are told from anything else printed there.
MARK = "FIRST-CALL "


def first_call_child(n: int) -> None:
    """In a fresh process: CUDA's context, then the service's warm-up of the library paths (inputs
    uploaded from C-ordered host arrays, as a request's are), then a request's C-ordered ``n x n``
    float64 LU uploaded and solved twice. Prints a line per stage as it ends (``MARK`` + JSON: a
    stage that hangs still leaves the ones before it), the first solve's cProfile last."""
    t0 = time.perf_counter()
    import cupy
    import numpy as np

    def say(**fields: object) -> None:
        print(MARK + json.dumps(fields), flush=True)

    say(stage="import s", seconds=time.perf_counter() - t0)
    start = time.perf_counter()
    cupy.cuda.Device(0).synchronize()  # the first CUDA call: the driver and the context start here
    say(stage="context s", seconds=time.perf_counter() - start)
    stream = cupy.cuda.get_current_stream()

    def timed(key: str, fn: Callable[[], object]) -> object:
        start = time.perf_counter()
        out = fn()
        stream.synchronize()
        say(stage=key, seconds=time.perf_counter() - start)
        return out

    def warm_up() -> None:
        rng = np.random.default_rng(0)
        for batch, k in WARMUP_LIBRARY_SHAPES:
            shape = (k, k) if batch is None else (batch, k, k)  # service.app.warmup_shape
            A = cupy.asarray(rng.standard_normal(shape) + k * np.eye(k))
            LU, piv = lu_core.lu_factor(A)
            LU, piv = (cupy.asarray(np.ascontiguousarray(cupy.asnumpy(x))) for x in (LU, piv))  # as a request
            lu_core.lu_solve(LU, piv, cupy.asarray(rng.standard_normal((*shape[:-1], 1))))

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
    say(profile=_table(profiler, "cumulative", FIRST_CALL_TOP))


def _child_lines(stdout: str | bytes | None) -> dict:
    """What a fresh process printed: ``{"times": {stage: seconds}, "profile": text}`` (either may be missing)."""
    text = stdout.decode(errors="replace") if isinstance(stdout, bytes) else stdout or ""
    result: dict = {"times": {}}
    for line in text.splitlines():
        if not line.startswith(MARK):
            continue
        try:
            fields = json.loads(line[len(MARK) :])
        except ValueError:
            continue
        if "stage" in fields:
            result["times"][fields["stage"]] = fields["seconds"]
        elif "profile" in fields:
            result["profile"] = fields["profile"]
    return result


def _order(text: str) -> int:
    """``--first-call-child``'s matrix order: a positive integer."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"a matrix order is at least 1, not {n}")
    return n


def child_argv(n: int) -> list[str]:
    """The command line of one of :func:`first_call`'s fresh processes."""
    return [sys.executable, "-m", "bench.profile_gpu", "--out", os.devnull, "--first-call-child", str(n)]


def first_call(n: int = FIRST_CALL_N, runs: int = 2) -> list[dict]:
    """``first_call_child`` in ``runs`` fresh processes one after the other, sharing a new, empty
    CUDA JIT cache (``CUDA_CACHE_PATH``) and the usual CuPy kernel cache (``FIRST_CALL_READING``).
    Each result, also on stderr as it comes (a parent stopped from outside keeps them in the log):
    the stages that ended, the profile, and an error if it failed."""
    results = []
    with tempfile.TemporaryDirectory(prefix="lu-cuda-cache-") as cache:
        env = {**os.environ, "CUDA_CACHE_PATH": cache}
        for _ in range(runs):
            try:
                done = subprocess.run(
                    child_argv(n), capture_output=True, text=True, timeout=FIRST_CALL_TIMEOUT_S, env=env, check=False
                )
            except subprocess.TimeoutExpired as exc:
                results.append({**_child_lines(exc.stdout), "error": f"no answer in {FIRST_CALL_TIMEOUT_S} s"})
                continue
            result = _child_lines(done.stdout)
            if done.returncode != 0:
                result["error"] = f"exit {done.returncode}: {done.stderr.strip()[-400:]}"
            results.append(result)
            print(f"first {n} lu_solve, fresh process {len(results)}: {result}", file=sys.stderr, flush=True)
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
        lines += [title, "", FIRST_CALL_READING, ""]
        keys = ["import s", "context s", "warm-up s", "upload s", "first lu_solve s", "second lu_solve s"]
        lines += ["| process | " + " | ".join(keys) + " | error |", "|---|" + "---:|" * len(keys) + "---|"]
        for i, r in enumerate(first, 1):
            cells = [f"{r['times'][k]:.3f}" if k in r.get("times", {}) else "–" for k in keys]
            error = " ".join(str(r.get("error", "")).replace("|", "/").split())
            lines.append(f"| {i} | " + " | ".join(cells) + f" | {error} |")
        for i, r in enumerate(first, 1):
            if "profile" in r:
                head = f"### Process {i}: cProfile of the first lu_solve (top {FIRST_CALL_TOP} by cumulative time)"
                lines += ["", head, "", "```", r["profile"], "```"]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the report")
    ap.add_argument("--seconds", type=seconds_budget, default=None, help="start no case after this many seconds")
    ap.add_argument("--first-call-child", type=_order, default=None, help=argparse.SUPPRESS)  # first_call's processes
    args = ap.parse_args(argv)
    if args.first_call_child is not None:
        first_call_child(args.first_call_child)
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
    path.write_text(report(device, rows, profiles, first))
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
