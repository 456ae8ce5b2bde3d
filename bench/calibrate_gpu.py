"""Measure the GPU backend's crossovers and print the values for ``lu_core/_gpu/_tuning.py``.

    python -m bench.calibrate_gpu --out DIR [--quick]

Times every routine the dispatch can pick on the same data, with CUDA events
(medians after warm-up): for the factorization our small-matrix kernel,
cuBLAS ``getrfBatched`` and a cuSOLVER ``getrf`` per matrix (rectangular
batches: our kernel and cuSOLVER, first); for the solve our
small-vector kernel, cuBLAS ``getrsBatched`` and ``trsmBatched``. Writes
``DIR/calibrate-gpu-<device>.md`` (every time, and the fastest routine per case)
and prints the suggested table entries. Where CUDA sees no device it says so and
exits 0, so scripts can call it anywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import math
import pathlib
import re
import sys
import time
from collections.abc import Callable, Iterator

import numpy as np

from bench.core_gpu import _cuda_time, available, device_name, seconds_budget

FACTOR_N = (4, 8, 16, 24, 32, 48, 64, 128, 256, 512, 1024)
#: Rectangular (m, n) for RECT_FACTOR_MAX_BYTES: in float64 about 16, 48, 95, 128 and 190 KiB a matrix in
#: shared memory ((m | 1) x n x 8; float32 half, complex128 double), alone and in batches.
RECT_SHAPES = ((63, 32), (127, 48), (127, 96), (255, 64), (191, 128))
RECT_BATCH = (1, 16, 512)
FACTOR_BATCH = (2, 8, 64, 512, 4096, 32768)
SOLVE_N = (8, 16, 32, 48, 64, 96, 128, 256)
SOLVE_NRHS = (1, 2, 4, 16, 64)
SOLVE_BATCH = (8, 512, 8192)
MAX_ELEMENTS = 1 << 25
DTYPES = ("float32", "float64", "complex64", "complex128")
#: A cuSOLVER call per matrix is timed up to this batch: beyond, it is a Python loop that loses by
#: orders of magnitude (0.78 s for 32768 4x4 matrices on an H200) and would spend the time budget.
CUSOLVER_MAX_BATCH = 512
#: Rectangular cases that decide RECT_FACTOR_MAX_BYTES: batches from this size. A single matrix is
#: reported, not decisive: the dispatch never depends on the batch (a matrix's bits must not change
#: with what it is factored with), and one matrix loses little time in absolute terms.
RECT_DECISIVE_BATCH = 16


@contextlib.contextmanager
def _tuned(**values: object) -> Iterator[None]:
    """Force one dispatch choice by overriding ``_tuning`` entries for the duration."""
    from lu_core._gpu import _tuning

    saved = {k: getattr(_tuning, k) for k in values}
    for k, v in values.items():
        setattr(_tuning, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(_tuning, k, v)


def _factor_paths(n: int, dtype: str, batch: int) -> dict[str, dict[str, object]]:
    from lu_core._gpu._tuning import SHARED_BYTES, matrix_bytes

    paths: dict[str, dict[str, object]] = {
        "getrfBatched": {"SMALL_FACTOR_MAX_N": 0, "getrf_batched_wins": lambda *a: True},
    }
    if batch <= CUSOLVER_MAX_BATCH:
        paths["cusolver"] = {"SMALL_FACTOR_MAX_N": 0, "getrf_batched_wins": lambda *a: False}
    if matrix_bytes(n, n, dtype) <= SHARED_BYTES:  # our kernel takes any square matrix a warp can hold
        paths["own"] = {"SMALL_FACTOR_MAX_N": n}
    return paths


def _rect_paths(m: int, n: int, dtype: str) -> dict[str, dict[str, object]]:
    import cupy as cp

    from lu_core._gpu._factor import _device_optin
    from lu_core._gpu._tuning import SHARED_BYTES, matrix_bytes

    paths: dict[str, dict[str, object]] = {"cusolver": {"RECT_FACTOR_MAX_BYTES": 0}}
    need = matrix_bytes(m, n, cp.dtype(dtype))
    if need <= max(SHARED_BYTES, _device_optin()):
        paths["own"] = {"RECT_FACTOR_MAX_BYTES": need}
    return paths


def _solve_paths(n: int) -> dict[str, dict[str, object]]:
    paths: dict[str, dict[str, object]] = {
        "getrsBatched": {"SMALL_SOLVE_MAX_N": 0, "GETRS_BATCHED_MAX_N": 1 << 30, "GETRS_BATCHED_MAX_NRHS": 1 << 30},
        "trsmBatched": {"SMALL_SOLVE_MAX_N": 0, "GETRS_BATCHED_MAX_N": 0},
    }
    if n <= 32:
        paths["own"] = {"SMALL_SOLVE_MAX_N": 32}
    return paths


def _time_paths(paths: dict[str, dict[str, object]], fn: Callable[[], object], repeats: int) -> dict[str, float]:
    out = {}
    for name, values in paths.items():
        with _tuned(**values):
            out[name], _ = _cuda_time(fn, repeats)
    return out


def measure(
    quick: bool, progress: Callable[[str], None], seconds: float | None = None
) -> tuple[list[dict], list[dict]]:
    """Factor and solve timings; ``seconds``: start no case past this budget (the report lists what was
    measured). Most decisive first: the square factorization and the solve in float64 and float32, then
    the rectangular batches, then the complex dtypes (on the first H200, 50 s went on the rectangular
    cases and float32's factorization, and no solve was measured)."""
    import cupy as cp

    import lu_core

    start = time.perf_counter()

    def more() -> bool:
        return seconds is None or time.perf_counter() - start < seconds

    from lu_core._gpu._tuning import matrix_bytes

    rng = cp.random.default_rng(0)
    repeats = 3 if quick else 10
    factor_rows: list[dict] = []
    solve_rows: list[dict] = []

    def rectangular(dtype: str) -> None:  # cuSOLVER's side is a call per matrix: few repeats
        for m, n in RECT_SHAPES[:2] if quick else RECT_SHAPES:
            for batch in RECT_BATCH:
                if not more():
                    continue
                A = rng.standard_normal((batch, m, n)).astype(dtype)
                times = _time_paths(_rect_paths(m, n, dtype), lambda A=A: lu_core.lu_factor_ex(A), 3)
                need = matrix_bytes(m, n, cp.dtype(dtype))
                row = {"dtype": dtype, "m": m, "n": n, "batch": batch, "KiB": need // 1024, "bytes": need}
                factor_rows.append({**row, **times})
                progress(f"factor {dtype} {m}x{n} batch={batch}: {times}")

    def square(dtype: str) -> None:
        for n in FACTOR_N[:6] if quick else FACTOR_N:
            for batch in FACTOR_BATCH[:3] if quick else FACTOR_BATCH:
                if batch * n * n > MAX_ELEMENTS or not more():
                    continue
                A = rng.standard_normal((batch, n, n)).astype(dtype) + n * cp.eye(n, dtype=dtype)
                times = _time_paths(_factor_paths(n, dtype, batch), lambda A=A: lu_core.lu_factor_ex(A), repeats)
                factor_rows.append({"dtype": dtype, "n": n, "batch": batch, **times})
                progress(f"factor {dtype} n={n} batch={batch}: {times}")
        solves(dtype)

    def solves(dtype: str) -> None:
        for n in SOLVE_N[:4] if quick else SOLVE_N:
            for batch in SOLVE_BATCH[:2] if quick else SOLVE_BATCH:
                if batch * n * n > MAX_ELEMENTS or not more():
                    continue
                A = rng.standard_normal((batch, n, n)).astype(dtype) + n * cp.eye(n, dtype=dtype)
                LU, piv = lu_core.lu_factor(A)
                for nrhs in SOLVE_NRHS[:3] if quick else SOLVE_NRHS:
                    B = rng.standard_normal((batch, n, nrhs)).astype(dtype)
                    times = _time_paths(
                        _solve_paths(n), lambda LU=LU, piv=piv, B=B: lu_core.lu_solve(LU, piv, B), repeats
                    )
                    solve_rows.append({"dtype": dtype, "n": n, "batch": batch, "nrhs": nrhs, **times})
                    progress(f"solve {dtype} n={n} batch={batch} nrhs={nrhs}: {times}")

    real, complex_ = ("float64", "float32"), () if quick else ("complex64", "complex128")
    for dtype in real:
        square(dtype)
    for dtype in (*real, *complex_):
        rectangular(dtype)
    for dtype in complex_:
        square(dtype)
    return factor_rows, solve_rows


#: Batches factored by each library routine for the pivot comparison (not timed; seconds). Our own
#: kernel takes every square matrix up to 32, so the libraries see n > 32 only.
PIVOT_SHAPES = ((64, 40, 40), (16, 96, 96))
PROBE_N = 40


def _measure_probe(dtype: str, n: int = PROBE_N) -> np.ndarray:
    """One ``n x n`` matrix whose first column has ``3 + 3i`` (LAPACK's ``|re| + |im|``: 6, modulus
    4.24) above ``5`` (both 5), the rest small: LAPACK's measure pivots on row 1 (1-based), a measure
    that ranks 5 first (the modulus, ``max(|re|, |im|)``) on row 2."""
    a = np.full((1, n, n), 0.01, dtype=dtype) + np.eye(n, dtype=dtype)
    a[0, 0, 0], a[0, 1, 0] = 3 + 3j, 5
    return a


def pivot_agreement(progress: Callable[[str], None]) -> list[str]:
    """Whether each library routine picks LAPACK's pivots: the GPU's pivots against SciPy's LAPACK
    ``?getrf`` on the same random batches, per dtype, and for complex dtypes which measure a
    constructed matrix reveals. Issue 11 asks it of cuBLAS ``getrfBatched``, which does not document
    its complex measure (the H100: not LAPACK's); the parity tests compare pivots only where the
    routine uses LAPACK's measure and check ``P @ L @ U`` everywhere; this says which it is.
    A case that fails is reported in its row; the others still run."""
    import cupy as cp
    import scipy.linalg

    import lu_core

    rng = np.random.default_rng(0)
    rows = [
        "Single precision: GPU and CPU rounding can change a pivot now and then, so a count below the "
        "batch there says little about the measure; double precision and the probe do.",
        "",
        "| routine | dtype | batch x n | matrices with LAPACK's pivots | measure (probe) |",
        "|---|---|---|---:|---|",
    ]
    forced = _factor_paths(PROBE_N, "float64", 1)  # the timings' own overrides for the two library routines
    routines = [(name, forced[name]) for name in ("getrfBatched", "cusolver")]
    for path, values in routines:
        for dtype in DTYPES:
            complex_ = dtype.startswith("complex")
            for i, (batch, n, _) in enumerate(PIVOT_SHAPES):
                a = rng.standard_normal((batch, n, n))
                if complex_:
                    a = a + 1j * rng.standard_normal((batch, n, n))
                a = a.astype(dtype)
                try:
                    with _tuned(**values):
                        piv = cp.asnumpy(lu_core.lu_factor_ex(cp.asarray(a))[1])
                        probe = None
                        if complex_ and i == 0:
                            probe = int(cp.asnumpy(lu_core.lu_factor_ex(cp.asarray(_measure_probe(dtype)))[1])[0, 0])
                    lapack = scipy.linalg.lu_factor(a, check_finite=False)[1] + 1  # 1-based, as lu_core's
                    same = f"{int((piv == lapack).all(axis=-1).sum())} / {batch}"
                    names = {1: "LAPACK's abs(re) + abs(im)", 2: "not LAPACK's: 5 over 3+3i (modulus?)"}
                    measure = "-" if probe is None else names.get(probe, f"row {probe}")
                except Exception as exc:  # the other cases, and the timings, still run
                    same, measure = f"failed: {type(exc).__name__}: {exc}"[:200].replace("|", "/"), "-"
                rows.append(f"| {path} | {dtype} | {batch} x {n} | {same} | {measure} |")
                progress(rows[-1])
    return rows


def _best(row: dict, keys: tuple[str, ...]) -> str:
    return min((k for k in keys if k in row), key=lambda k: row[k])


#: How far above the least cost (``_cheapest_threshold``) a threshold still counts as as good: one
#: case 10% slower.
THRESHOLD_NOISE = math.log(1.1)


def _cheapest_threshold(rows: list[dict], keys: tuple[str, ...], path: str, others: tuple[str, ...]) -> tuple:
    """The threshold, a value per key, the measurements support: rows whose every key is at most its
    value go to ``path``, the rest to the fastest of ``others``; a threshold's cost is the sum over
    rows of ``log(chosen / fastest)`` (how much slower than the best the table would be, case by case,
    in proportion). Candidates are 0 (never) and the measured values; one that would send a row to
    ``path`` where ``path`` was not measured is out. Of those within ``THRESHOLD_NOISE`` of the least
    cost, the one that sends the fewest rows to ``path`` (then the smallest): one case won by a few
    per cent is noise, not a crossover."""
    scored = []
    for candidate in itertools.product(*([0, *sorted({r[k] for r in rows})] for k in keys)):
        cost, sent = 0.0, 0
        for r in rows:
            inside = all(r[k] <= v for k, v in zip(keys, candidate, strict=True))
            if inside and path not in r:
                break
            fastest = min(r[p] for p in (path, *others) if p in r)
            chosen = r[path] if inside else min((r[p] for p in others if p in r), default=fastest)
            cost, sent = cost + math.log(chosen / fastest), sent + inside
        else:
            scored.append((cost, sent, candidate))
    if not scored:
        return tuple(0 for _ in keys)
    least = min(cost for cost, _, _ in scored)
    return min((sent, candidate) for cost, sent, candidate in scored if cost <= least + THRESHOLD_NOISE)[1]


def suggest(factor_rows: list[dict], solve_rows: list[dict]) -> dict[str, object]:
    """Table entries the measurements support: for a path chosen by n (and the number of right-hand
    sides), the threshold that costs least over every case measured (``_cheapest_threshold``), so a
    few noisy wins do not move it (the first H100 run: getrsBatched won 15 of 180 library solves,
    scattered from n = 48 to 256, and lost the rest by 13% on average; the largest single win had
    suggested n <= 256); for rectangular matrices the largest size in shared memory up to which our
    kernel wins every case of a batch of ``RECT_DECISIVE_BATCH`` or more. An entry nothing measured
    is None ("not measured"), never 0."""
    rect: dict[int, list[dict]] = {}  # by the exact bytes of one matrix in shared memory
    for r in factor_rows:
        if "m" in r and r["batch"] >= RECT_DECISIVE_BATCH:
            rect.setdefault(r.get("bytes", r["KiB"] * 1024), []).append(r)
    square = [r for r in factor_rows if "m" not in r]
    rect_bytes = 0
    for need in sorted(rect):  # up to the first size where our kernel loses a case (any dtype or batch)
        if any(_best(r, ("own", "cusolver")) != "own" for r in rect[need]):
            break
        rect_bytes = need
    # Our factorization is measured wherever a warp's shared memory holds the matrix, and the table
    # gives it no other (``_tuning.own_kernel``): a row without it goes to the libraries whatever
    # the threshold. Our solve is measured up to n = 32 (its limit): rows beyond rule larger ones out.
    own_rows = [r for r in square if "own" in r]
    (own_factor,) = _cheapest_threshold(own_rows, ("n",), "own", ("getrfBatched", "cusolver"))
    (own_solve,) = _cheapest_threshold(solve_rows, ("n",), "own", ("getrsBatched", "trsmBatched"))
    library_solves = [r for r in solve_rows if r["n"] > 32]
    getrs_n, getrs_nrhs = _cheapest_threshold(library_solves, ("n", "nrhs"), "getrsBatched", ("trsmBatched",))
    crossovers = {}
    for r in square:
        if r["n"] > 32 and "cusolver" in r and _best(r, ("getrfBatched", "cusolver")) == "getrfBatched":
            key = (r["dtype"], r["batch"])
            crossovers[key] = max(crossovers.get(key, 0), r["n"])

    def measured(rows: list[dict], value: int) -> int | None:
        return value if rows else None

    return {
        "SMALL_FACTOR_MAX_N": measured(square, own_factor),
        "SMALL_SOLVE_MAX_N": measured(solve_rows, own_solve),
        "RECT_FACTOR_MAX_BYTES": measured(list(rect), rect_bytes),
        "GETRS_BATCHED_MAX_N": measured(library_solves, getrs_n),
        "GETRS_BATCHED_MAX_NRHS": measured(library_solves, getrs_nrhs),
        "getrfBatched largest winning n per (dtype, batch)": dict(sorted(crossovers.items())),
    }


def _table(rows: list[dict], keys: tuple[str, ...], paths: tuple[str, ...]) -> list[str]:
    head = [*keys, *(f"{p} (ms)" for p in paths), "fastest"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r[k]) for k in keys]
        cells += [f"{r[p] * 1e3:.3f}" if p in r else "" for p in paths]
        lines.append("| " + " | ".join([*cells, _best(r, paths)]) + " |")
    return lines


def report(
    device: str,
    factor_rows: list[dict],
    solve_rows: list[dict],
    suggested: dict[str, object],
    pivots: list[str] | None = None,
) -> str:
    lines = [
        f"# GPU dispatch calibration, {device}, {dt.date.today().isoformat()}",
        "",
        "Command: `python -m bench.calibrate_gpu --out DIR`. Medians of CUDA-event timings.",
        "",
        "## Suggested lu_core/_gpu/_tuning.py entries",
        "",
        *(f"- `{k}`: {'not measured (time budget)' if v is None else v}" for k, v in suggested.items()),
        "",
        "## lu_factor",
        "",
        *_table([r for r in factor_rows if "m" not in r], ("dtype", "n", "batch"), ("own", "getrfBatched", "cusolver")),
        "",
        "## lu_factor, rectangular (KiB: one matrix in shared memory)",
        "",
        *_table([r for r in factor_rows if "m" in r], ("dtype", "m", "n", "batch", "KiB"), ("own", "cusolver")),
        "",
        "## lu_solve",
        "",
        *_table(solve_rows, ("dtype", "n", "batch", "nrhs"), ("own", "getrsBatched", "trsmBatched")),
        "",
        "## Pivots of the library routines against LAPACK's (SciPy's ?getrf), random matrices",
        "",
        *(pivots or ["not measured"]),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.calibrate_gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the report")
    ap.add_argument("--quick", action="store_true", help="a small grid (a smoke test)")
    ap.add_argument("--seconds", type=seconds_budget, default=None, help="start no case after this many seconds")
    args = ap.parse_args(argv)
    problem = available()
    if problem is not None:
        print(f"no CUDA device: {problem}; nothing to calibrate", file=sys.stderr)
        return 0
    device = device_name()
    progress = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    # The pivot comparison first (seconds): a question the timings cannot answer, kept when they run out of time.
    started = time.perf_counter()
    try:
        pivots = pivot_agreement(progress)
    except Exception as exc:  # the calibration goes on; the report says what failed
        pivots = [f"the comparison failed: {exc!r}"]
    seconds = None if args.seconds is None else max(1.0, args.seconds - (time.perf_counter() - started))
    factor_rows, solve_rows = measure(args.quick, progress, seconds)
    suggested = suggest(factor_rows, solve_rows)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    path = out / f"calibrate-gpu-{slug}.md"
    path.write_text(report(device, factor_rows, solve_rows, suggested, pivots))
    for k, v in suggested.items():
        print(f"{k} = {v}")
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
