"""core-cpu suite: lu_core against PyTorch (CPU), JAX (jit) and SciPy on the same machine, same run, as ratios.

    python -m bench --suite core-cpu [--quick] [--runs 2]     (or python -m bench.core_cpu)

Grid: batch 1 ... 100000 and n 8 ... 2048 (cases above 2^24 elements left out),
float32 and float64; lu_factor, lu_unpack, lu_solve with 1 and with 64 right-hand
sides, solve. Each operation is timed as a user calls it (from a C-ordered NumPy
array or the library's own factorization), with medians over interleaved rounds.
The headline per cell is lu_core's time over the best peer's (below 1: lu_core
faster). The whole grid runs ``--runs`` times (2 by default) and every run's
ratio is shown, so the noise of a shared machine is visible.

JAX is timed through ``jax.jit`` on arrays already on its CPU device, with
``block_until_ready``; the warm-up call compiles, so compile time is excluded.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import pathlib
import sys
from collections.abc import Callable

import numpy as np
import scipy.linalg

import lu_core
from bench._report import best_peer_table, summary, write
from bench._timing import interleaved, machine
from lu_core._cpu import _tuning as lapack_tuning

GRID_N = (8, 32, 128, 512, 2048)
GRID_BATCH = (1, 100, 10000, 100000)
QUICK_N = (8, 32)
QUICK_BATCH = (1, 100)
MAX_ELEMENTS = 1 << 24  # 128 MiB of float64 per operand
DTYPES = ("float32", "float64")
PEERS = ("torch", "jax", "scipy", "numpy")
#: SciPy loops over a batch matrix by matrix; from batch 10000 on it took 10-100x the time of the
#: other peers in every earlier run, so it cannot be the best peer there and is left out.
SCIPY_MAX_BATCH = 100
WIDE_RHS = 64
#: How long the harness waits, busy, after a contender whose idle threads may spin: OpenBLAS's spin
#: 2**28 cycles after a threaded call (its default THREAD_TIMEOUT), ~0.1 s at 2.5 GHz; a margin. (lu_core's
#: threaded MKL runs on GNU OpenMP with OMP_WAIT_POLICY=PASSIVE, whose threads sleep at once; it waits
#: anyway above the pool's limit, where lu_core runs on SciPy's OpenBLAS without MKL.)
SPIN_S = 0.15
BLOCK_S = 0.002  # a block of calls lasts at least this long (bench._timing.interleaved's min_block_s)


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


def _jax_peers():
    """JAX's jitted functions, or None where JAX is not installed."""
    try:
        import jax
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)
    # XLA compiles each shape and dtype anew (seconds each on a busy 2-core VM); an on-disk cache
    # lets a second run of the grid, or another process, reuse the compiled code.
    jax.config.update("jax_compilation_cache_dir", str(pathlib.Path.home() / ".cache" / "lu_core-bench-jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    import jax.numpy as jnp
    import jax.scipy.linalg as jsl

    def unpack(lu, piv):
        # jax has no unpack of a packed factorization: tril/triu and the permutation, jitted.
        m, n = lu.shape[-2:]
        k = min(m, n)
        L = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
        U = jnp.triu(lu[..., :k, :])
        perm = jax.lax.linalg.lu_pivots_to_permutation(piv, m)
        P = jnp.swapaxes(jax.nn.one_hot(perm, m, dtype=lu.dtype), -1, -2)
        return P, L, U

    return {
        "jax": jax,
        "put": jax.device_put,
        "lu_factor": jax.jit(jsl.lu_factor),
        "lu_unpack": jax.jit(unpack),
        "lu_solve": jax.jit(lambda lu, piv, b: jsl.lu_solve((lu, piv), b)),
        "solve": jax.jit(jnp.linalg.solve),
    }


def _blocked(fn: Callable[[], object]) -> Callable[[], object]:
    """A JAX call that returns only once its result is computed."""

    def call() -> object:
        import jax

        return jax.block_until_ready(fn())

    return call


def run_case(batch: int, n: int, dtype: str, torch, jx, budget_s: float = 1.0) -> list[dict]:
    rng = np.random.default_rng(0)
    A = (rng.standard_normal((batch, n, n)) + n**0.5 * np.eye(n)).astype(dtype)
    LU, piv = lu_core.lu_factor(A)
    rows = []

    def time_op(op: str, contenders: dict[str, Callable[[], object]]) -> None:
        # Blocks of 3 calls (or BLOCK_S long) after a 20 ms pause: peers' worker threads (OpenMP, Eigen)
        # spin for a while after their calls, and a contender timed right after them would pay for it. Some spin
        # longer (OpenBLAS ~0.1 s after a threaded call), so the harness waits them out after each
        # contender that leaves them so: SciPy, JAX, and lu_core above LAPACK_POOL_MAX_N (below,
        # its BLAS calls run one thread each). Measured, 64-right-hand-side solves at 100 x 128
        # float64, lu_core against one peer: 16.6 ms after SciPy's (9.1 with the wait; SciPy 10.6),
        # 16.6 after JAX's (11.0; JAX 16.5), 8.8 after PyTorch's (9.4 with the wait).
        settle = {"scipy": SPIN_S, "jax": SPIN_S}
        if n > lapack_tuning.LAPACK_POOL_MAX_N:
            settle["lu_core"] = SPIN_S
        times = interleaved(
            contenders,
            budget_s=budget_s,
            max_rounds=5,
            block=3,
            pause=0.02,
            slow_factor=5.0,
            settle=settle,
            min_block_s=BLOCK_S,
        )
        row = {"op": op, "dtype": dtype, "batch": batch, "n": n}
        row.update(ours=times["lu_core"].median, spread=times["lu_core"].spread)
        row.update({p: times[p].median for p in PEERS if p in times})
        row["cold"] = {("ours" if name == "lu_core" else name): t.cold for name, t in times.items()}
        rows.append(row)

    At = torch.from_numpy(A) if torch is not None else None
    Aj = jx["put"](A) if jx is not None else None
    with_scipy = batch <= SCIPY_MAX_BATCH
    c = {"lu_core": lambda: lu_core.lu_factor(A)}
    if with_scipy:
        c["scipy"] = lambda: scipy.linalg.lu_factor(A, check_finite=False)
    if torch is not None:
        c["torch"] = lambda: torch.linalg.lu_factor(At)
    if jx is not None:
        c["jax"] = _blocked(lambda: jx["lu_factor"](Aj))
    time_op("lu_factor", c)

    # SciPy has no unpack of a packed factorization: that peer is the obvious NumPy code.
    c = {"lu_core": lambda: lu_core.lu_unpack(LU, piv), "numpy": lambda: _numpy_unpack(LU, piv)}
    if torch is not None:
        LUt, pivt = torch.linalg.lu_factor(At)
        c["torch"] = lambda: torch.lu_unpack(LUt, pivt)
    if jx is not None:
        LUj, pivj = jx["lu_factor"](Aj)
        c["jax"] = _blocked(lambda: jx["lu_unpack"](LUj, pivj))
    time_op("lu_unpack", c)

    sp_lu = scipy.linalg.lu_factor(A, check_finite=False) if with_scipy else None
    for op, nrhs in (("lu_solve", 1), (f"lu_solve_{WIDE_RHS}", WIDE_RHS)):
        B = rng.standard_normal((batch, n, nrhs)).astype(dtype)
        c = {"lu_core": lambda B=B: lu_core.lu_solve(LU, piv, B)}
        if with_scipy:
            c["scipy"] = lambda B=B: scipy.linalg.lu_solve(sp_lu, B, check_finite=False)
        if torch is not None:
            Bt = torch.from_numpy(B)
            c["torch"] = lambda Bt=Bt: torch.linalg.lu_solve(LUt, pivt, Bt)
        if jx is not None:
            Bj = jx["put"](B)
            c["jax"] = _blocked(lambda Bj=Bj: jx["lu_solve"](LUj, pivj, Bj))
        time_op(op, c)
        del c, B

    B = rng.standard_normal((batch, n, 1)).astype(dtype)
    c = {"lu_core": lambda: lu_core.solve(A, B)}
    if with_scipy:
        c["scipy"] = lambda: scipy.linalg.solve(A, B, check_finite=False)
    if torch is not None:
        Bt = torch.from_numpy(B)
        c["torch"] = lambda: torch.linalg.solve(At, Bt)
    if jx is not None:
        Bj = jx["put"](B)
        c["jax"] = _blocked(lambda: jx["solve"](Aj, Bj))
    time_op("solve", c)
    return rows


def render(runs: list[list[dict]], facts: dict[str, str], command: str) -> str:
    lines = [
        f"# lu_core CPU benchmark, {dt.date.today().isoformat()}",
        "",
        f"Command: `{command}`. Medians over interleaved rounds of each contender (blocks of 3 calls, going on",
        f"until the block has lasted {BLOCK_S * 1e3:g} ms where calls are shorter, at most 1000 calls, so that a",
        "call of microseconds is timed in its steady state rather than in the VM's wake-up after the pause; order",
        "rotated every round, 20 ms apart; after SciPy's and JAX's blocks, and lu_core's where it calls",
        f"threaded LAPACK (n > {lapack_tuning.LAPACK_POOL_MAX_N}), the harness waits {SPIN_S} s, busy, for their",
        "spinning threads to go idle; a peer whose warm call takes over 5× the fastest's is timed by that call",
        "alone); `spread` is lu_core's interquartile range over its median. Headline: lu_core",
        "time / the best peer's time in the same cell (below 1: lu_core faster), shown for every run of the",
        "grid so the noise is visible; the per-peer ratios are those of run 1. Peers: PyTorch CPU",
        "(`torch.linalg`, `torch.lu_unpack`), JAX (`jax.jit` of `jax.scipy.linalg` / `jnp.linalg.solve`,",
        "`block_until_ready`, compile excluded), SciPy (`scipy.linalg`, batched by SciPy) and, for `lu_unpack`,",
        f"which SciPy lacks, plain NumPy (`tril`/`triu`/`put_along_axis`). `lu_solve_{WIDE_RHS}`: {WIDE_RHS}",
        "right-hand sides per system; the other solves have one.",
        "",
        summary(runs),
        "",
        *_cold_summary(runs),
        best_peer_table(runs, PEERS),
        "",
        "## Machine",
        "",
        *[f"- {k}: {v}" for k, v in facts.items()],
        "",
        "Absolute times are from the machine above and are indicative only; the ratios, measured in the",
        "same run, are the result.",
    ]
    return "\n".join(lines) + "\n"


def _cold_summary(runs: list[list[dict]]) -> list[str]:
    """The summary of each block's first calls (``Timing.cold``), where the runs recorded them."""
    if not all("cold" in r for rows in runs for r in rows):
        return []  # reports from before 2026-11-28-cpu-4
    keys = ("op", "dtype", "batch", "n")
    cold = [[{**{k: r[k] for k in keys}, **r["cold"]} for r in rows] for rows in runs]
    return [
        "The same ratios over each block's first 3 calls only, right after its pause (each contender's: a caller's",
        "first calls after idling, and the measure of the reports before 2026-11-28-cpu-3, whose blocks were",
        "3 calls long):",
        "",
        summary(cold),
        "",
    ]


def run(
    quick: bool,
    out: pathlib.Path | None,
    progress: Callable[[str], None],
    runs: int | None = None,
    dtypes: tuple[str, ...] = DTYPES,
) -> pathlib.Path | None:
    try:
        import torch
    except ImportError:
        torch = None
        progress("PyTorch not installed: comparing without it")
    jx = _jax_peers()
    if jx is None:
        progress("JAX not installed (pip install -e '.[bench]'): comparing without it")
    nruns = runs if runs is not None else (1 if quick else 2)
    todo = [(b, n, d) for d in dtypes for (b, n) in cases(quick)]
    results: list[list[dict]] = []
    for r in range(nruns):
        rows: list[dict] = []
        for i, (b, n, d) in enumerate(todo, 1):
            progress(f"run {r + 1}/{nruns}, {i}/{len(todo)}: {d} batch {b} n {n}")
            rows += run_case(b, n, d, torch, jx, budget_s=0.3 if quick else 0.6)
        results.append(rows)
    command = "python -m bench --suite core-cpu" + (" --quick" if quick else "")
    if tuple(dtypes) != DTYPES:
        command += " --dtypes " + " ".join(dtypes)
    facts = machine()
    missing = [name for name, peer in (("PyTorch", torch), ("JAX", jx)) if peer is None]
    if missing:  # said in the report itself: "best peer" then means the best of fewer contenders
        facts["peers missing"] = ", ".join(missing) + " (not installed: pip install -e '.[bench]')"
    return _report(results, facts, command, quick, out, progress)


def _report(
    results: list[list[dict]],
    facts: dict[str, str],
    command: str,
    quick: bool,
    out: pathlib.Path | None,
    progress: Callable[[str], None],
) -> pathlib.Path | None:
    report = render(results, facts, command)
    print(report)
    if out is None:
        return None
    path = write(
        report,
        results[0],
        PEERS,
        out / f"{dt.date.today().isoformat()}-cpu{'-quick' if quick else ''}",
        "lu_core on the CPU",
    )
    path.with_suffix(".json").write_text(json.dumps({"facts": facts, "command": command, "runs": results}, indent=1))
    progress(f"wrote {path}, its plots and its data (.json)")
    return path


def combine(files: list[pathlib.Path], out: pathlib.Path | None, progress: Callable[[str], None]) -> None:
    """One report from the runs saved in several reports' ``.json`` files (e.g. runs made side by side)."""
    saved = [json.loads(f.read_text()) for f in files]
    runs = [run for s in saved for run in s["runs"]]
    each = " and ".join(f"{s['command']} ({len(s['runs'])} run{'s' * (len(s['runs']) != 1)})" for s in saved)
    command = f"{each}, in separate processes, combined with --combine ({len(runs)} runs)"
    _report(runs, saved[0]["facts"], command, False, out, progress)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a small grid and short timings (a smoke test)")
    ap.add_argument("--out", default="bench/results", help="folder for the report and plots ('' for none)")
    ap.add_argument("--runs", type=int, default=None, help="times the whole grid runs (default 2; 1 with --quick)")
    ap.add_argument("--combine", nargs="+", type=pathlib.Path, help="write one report from these reports' .json data")
    ap.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES), help="dtypes of the grid")
    args = ap.parse_args(argv)
    if args.combine:
        combine(args.combine, pathlib.Path(args.out) if args.out else None, lambda m: print(m, file=sys.stderr))
        return 0
    run(
        args.quick,
        pathlib.Path(args.out) if args.out else None,
        lambda m: print(f"[core-cpu] {m}", file=sys.stderr),
        args.runs,
        tuple(args.dtypes),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
