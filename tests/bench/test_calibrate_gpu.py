"""``python -m bench.calibrate_gpu``: says "no CUDA device" and exits 0 where there is none;
suggests table entries from its measurements; runs a quick grid on a device."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench import calibrate_gpu, core_gpu


@pytest.mark.skipif(core_gpu.available() is None, reason="a CUDA device is visible: the gpu test below runs instead")
def test_without_a_device_it_says_so_and_succeeds(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bench.calibrate_gpu", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "no CUDA device" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_out_is_required():
    with pytest.raises(SystemExit) as stop:
        calibrate_gpu.main([])
    assert stop.value.code == 2


def test_suggestions_follow_the_fastest_path():
    factor = [
        {"dtype": "float64", "n": 16, "batch": 64, "own": 1.0, "getrfBatched": 2.0, "cusolver": 9.0},
        {"dtype": "float64", "n": 32, "batch": 64, "own": 3.0, "getrfBatched": 2.0, "cusolver": 9.0},
        {"dtype": "float64", "n": 64, "batch": 64, "getrfBatched": 2.0, "cusolver": 9.0},
        {"dtype": "float64", "n": 512, "batch": 64, "getrfBatched": 9.0, "cusolver": 2.0},
    ]
    solve = [
        {"dtype": "float64", "n": 8, "batch": 8, "nrhs": 1, "own": 1.0, "getrsBatched": 2.0, "trsmBatched": 3.0},
        {"dtype": "float64", "n": 64, "batch": 8, "nrhs": 2, "getrsBatched": 1.0, "trsmBatched": 3.0},
        {"dtype": "float64", "n": 96, "batch": 8, "nrhs": 16, "getrsBatched": 5.0, "trsmBatched": 3.0},
    ]
    rect = [
        {"dtype": "float64", "m": 128, "n": 96, "batch": 16, "KiB": 96, "own": 1.0, "cusolver": 2.0},
        {"dtype": "float64", "m": 64, "n": 32, "batch": 512, "KiB": 16, "own": 1.0, "cusolver": 9.0},
        {"dtype": "float64", "m": 128, "n": 48, "batch": 16, "KiB": 48, "own": 1.0, "cusolver": 2.0},
        {"dtype": "float32", "m": 128, "n": 96, "batch": 16, "KiB": 48, "own": 1.0, "cusolver": 2.0},
        {"dtype": "float64", "m": 256, "n": 64, "batch": 16, "KiB": 64, "own": 3.0, "cusolver": 2.0},
    ]
    assert calibrate_gpu.suggest(rect, [])["RECT_FACTOR_MAX_BYTES"] == 48 * 1024  # up to the first loss
    lost_at_48 = [*rect[:3], {**rect[3], "own": 3.0}]  # one case of the same size lost: not that size
    assert calibrate_gpu.suggest(lost_at_48, [])["RECT_FACTOR_MAX_BYTES"] == 16 * 1024
    alone_slower = [*rect, {**rect[0], "batch": 1, "own": 5.0}]  # one matrix alone: reported, not decisive
    assert calibrate_gpu.suggest(alone_slower, [])["RECT_FACTOR_MAX_BYTES"] == 48 * 1024
    nothing = calibrate_gpu.suggest([], [])  # a budget that measured nothing suggests nothing, not 0
    assert nothing["SMALL_FACTOR_MAX_N"] is None and nothing["SMALL_SOLVE_MAX_N"] is None
    assert nothing["RECT_FACTOR_MAX_BYTES"] is None and nothing["GETRS_BATCHED_MAX_N"] is None
    assert "not measured" in calibrate_gpu.report("Test GPU", [], [], nothing)
    s = calibrate_gpu.suggest(factor + rect, solve)
    assert s["SMALL_FACTOR_MAX_N"] == 16 and s["SMALL_SOLVE_MAX_N"] == 8
    assert s["GETRS_BATCHED_MAX_N"] == 64 and s["GETRS_BATCHED_MAX_NRHS"] == 2
    assert s["getrfBatched largest winning n per (dtype, batch)"] == {("float64", 64): 64}
    text = calibrate_gpu.report("Test GPU", factor + rect, solve, s)
    assert "| float64 | 512 | 64 |  | 9000.000 | 2000.000 | cusolver |" in text
    assert "| float64 | 256 | 64 | 16 | 64 | 3000.000 | 2000.000 | cusolver |" in text


def test_a_threshold_is_the_cheapest_over_every_case_not_the_largest_win():
    """The first H100 run: getrsBatched won a few scattered library solves (n = 48 to 256) and lost the
    rest; at n = 48 our factorization won float32's batches by a little and lost the others by more."""

    def factor(dtype, n, own):
        return {"dtype": dtype, "n": n, "batch": 8, "own": own, "getrfBatched": 1.0, "cusolver": 9.0}

    def solve(n, nrhs, getrs):
        return {"dtype": "float64", "n": n, "batch": 8, "nrhs": nrhs, "getrsBatched": getrs, "trsmBatched": 1.0}

    square = [factor(d, 32, 0.5) for d in ("float32", "float64", "complex64")]
    square += [factor("float32", 48, 0.95), factor("float64", 48, 1.3), factor("complex64", 48, 1.3)]
    scattered = [solve(n, r, 0.95 if (n, r) in {(48, 1), (256, 4)} else 1.15) for n in (48, 64, 256) for r in (1, 4)]
    s = calibrate_gpu.suggest(square, scattered)
    assert s["SMALL_FACTOR_MAX_N"] == 32
    assert s["GETRS_BATCHED_MAX_N"] == 0 and s["GETRS_BATCHED_MAX_NRHS"] == 0
    # PyTorch's regime: getrsBatched wins every case with at most two right-hand sides up to n = 128.
    few = [solve(n, r, 0.8 if n <= 128 and r <= 2 else 1.2) for n in (48, 64, 128, 256) for r in (1, 2, 4, 16, 64)]
    s = calibrate_gpu.suggest([], few)
    assert s["GETRS_BATCHED_MAX_N"] == 128 and s["GETRS_BATCHED_MAX_NRHS"] == 2
    # Our solve is not measured past n = 32 (its limit): a larger threshold would send it there.
    own_solve = [solve(8, 1, 1.0) | {"own": 0.5}, solve(48, 1, 1.0), solve(48, 4, 1.0) | {"own": 0.1}]
    assert calibrate_gpu.suggest([], own_solve)["SMALL_SOLVE_MAX_N"] == 8
    # Our factorization is not measured where shared memory cannot hold the matrix (complex128 at 64):
    # the table never gives it those, so they do not hold back a threshold it wins by far.
    big = {k: v for k, v in factor("complex128", 64, 0.0).items() if k != "own"}
    assert (
        calibrate_gpu.suggest([factor("float64", 16, 0.5), factor("float64", 64, 0.1), big], [])["SMALL_FACTOR_MAX_N"]
        == 64
    )


@pytest.mark.gpu
def test_quick_calibration_on_a_device(tmp_path):
    assert calibrate_gpu.main(["--out", str(tmp_path), "--quick"]) == 0
    (report,) = tmp_path.glob("calibrate-gpu-*.md")
    assert "SMALL_FACTOR_MAX_N" in report.read_text()
    assert "| getrfBatched | complex128 | 64 x 40 |" in report.read_text()  # the pivot comparison ran


def test_the_first_h200_run_supports_the_rectangular_threshold():
    """Rows of bench/results/2026-11-26-gpu-proof-h200/2-measure-calibration.md (float64, ms): our kernel
    loses every single matrix to cuSOLVER and wins every batch of 16 and 512 up to 95 KiB."""
    rows = [
        {"dtype": "float64", "m": m, "n": n, "batch": b, "KiB": kib, "bytes": m * n * 8, "own": own, "cusolver": cus}
        for m, n, kib, b, own, cus in [
            (63, 32, 15, 1, 0.148, 0.118), (63, 32, 15, 16, 0.146, 1.002), (63, 32, 15, 512, 0.153, 29.421),
            (127, 48, 47, 1, 0.360, 0.135), (127, 48, 47, 16, 0.359, 1.371), (127, 48, 47, 512, 0.399, 42.256),
            (127, 96, 95, 1, 1.003, 0.201), (127, 96, 95, 16, 0.999, 2.486), (127, 96, 95, 512, 2.102, 77.612),
        ]
    ]  # fmt: skip
    # The exact size of the largest case won (127 x 96 x 8 bytes), not its KiB rounded down (it would lose it).
    assert calibrate_gpu.suggest(rows, [])["RECT_FACTOR_MAX_BYTES"] == 127 * 96 * 8


@pytest.mark.skipif(core_gpu.available() is None, reason="a CUDA device is visible: the proof runs it there")
def test_the_profile_without_a_device_says_so_and_succeeds(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench.profile_gpu", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0 and "no CUDA device" in done.stderr and list(tmp_path.iterdir()) == []


def test_the_profile_report_puts_ours_beside_torch():
    from bench import profile_gpu

    rows = [{"op": "lu_solve", "batch": 1, "n": 8, "dtype": "float64", "host us": 150.0, "device us": 190.25,
             "torch host us": 20.0, "torch device us": 35.0},
            {"op": "lu_factor", "batch": 1, "n": 8, "dtype": "float64", "host us": 60.0, "device us": 80.0}]  # fmt: skip
    text = profile_gpu.report("Test GPU", rows, {"lu_solve 1x8 float64": "ncalls  tottime\n  200  0.010  get"})
    assert "| lu_solve | 1 | 8 | float64 | 150.0 | 190.2 | 20.0 | 35.0 |" in text
    assert "| lu_factor | 1 | 8 | float64 | 60.0 | 80.0 | – | – |" in text
    assert "### lu_solve 1x8 float64" in text and "200  0.010  get" in text


def test_the_general_path_switch_turns_the_short_paths_off_and_back(monkeypatch):
    """profile_gpu's same-run comparison: inside ``_general_path`` the GPU backend's solve_direct and
    solve_fused answer None (every call takes the general path); after it, they are the real ones. (The
    backend module stands in: importing the real one needs cuBLAS, which CI does not install.)"""
    import sys
    import types

    from bench import profile_gpu

    class GpuBackend:
        def solve_direct(self, LU, pivots, B):
            return "direct"

        def solve_fused(self, a, b, out_batch, left):
            return "fused"

        def unpack_direct(self, LU, pivots, trusted=False):
            return "unpack"

    monkeypatch.setitem(sys.modules, "lu_core._gpu.backend", types.SimpleNamespace(GpuBackend=GpuBackend))
    real = {name: getattr(GpuBackend, name) for name in ("solve_direct", "solve_fused", "unpack_direct")}
    with profile_gpu._general_path():
        assert GpuBackend().solve_direct("LU", "pivots", "B") is None
        assert GpuBackend().solve_fused("a", "b", (), True) is None
        assert GpuBackend().unpack_direct("LU", "pivots", trusted=True) is None
    assert all(getattr(GpuBackend, name) is method for name, method in real.items())
    assert GpuBackend().solve_direct("LU", "pivots", "B") == "direct"
    assert GpuBackend().unpack_direct("LU", "pivots") == "unpack"
    assert {op for op, *_ in profile_gpu.GENERAL_PATH_CASES} == {"lu_solve", "solve", "lu_unpack"}
    # every short path a backend may have (the protocol's *_direct and *_fused) is switched off, but
    # those the GPU backend does not take: factor_direct (lu_factor_ex is one launch already) and
    # system_direct (solve's short paths are solve_fused's)
    from lu_core._backend import Backend

    short = {name for name in dir(Backend) if name.endswith(("_direct", "_fused"))}
    assert set(profile_gpu.SHORT_PATHS) == short - {"factor_direct", "system_direct"}


def test_the_profile_report_shows_the_first_large_solve_of_each_fresh_process():
    from bench import profile_gpu

    times = {"import s": 1.5, "context s": 0.5, "warm-up s": 0.25, "upload s": 0.125, "first lu_solve s": 6.3,
             "second lu_solve s": 0.003}  # fmt: skip
    first = [
        {"times": times, "profile": "ncalls  cumtime\n  1  6.300  getrs"},
        {"times": {"import s": 1.25}, "error": "no answer in 30 s | one\nmore line"},
    ]
    text = profile_gpu.report("Test GPU", [], {}, first)
    assert "| 1 | 1.500 | 0.500 | 0.250 | 0.125 | 6.300 | 0.003 |  |" in text
    assert "| 2 | 1.250 | – | – | – | – | – | no answer in 30 s / one more line |" in text  # one table row
    assert "### Process 1: cProfile of the first lu_solve" in text and "6.300  getrs" in text
    assert "Process 2: cProfile" not in text and "fresh process" not in profile_gpu.report("Test GPU", [], {})


def test_a_fresh_process_reports_each_stage_as_it_ends():
    from bench import profile_gpu

    out = "\n".join(
        [
            "a warning someone printed",
            profile_gpu.MARK + '{"stage": "import s", "seconds": 1.5}',
            profile_gpu.MARK + "{not json",
            profile_gpu.MARK + '{"profile": "ncalls"}',
        ]
    )
    assert profile_gpu._child_lines(out) == {"times": {"import s": 1.5}, "profile": "ncalls"}
    assert profile_gpu._child_lines(None) == {"times": {}}
    assert profile_gpu._child_lines(out.encode())["times"] == {"import s": 1.5}  # a timeout's stdout: bytes


def test_the_fresh_processes_command_line_is_accepted_and_warms_up_like_the_service():
    """The argv first_call gives its processes parses (a missing --out once stopped them at exit 2);
    without a device the process fails on CUDA, after its first stage. Its warm-up shapes are the
    service's library shapes."""
    from bench import gpu_proof, profile_gpu
    from service import app

    done = subprocess.run(profile_gpu.child_argv(8), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 2 and "required" not in done.stderr, done.stderr
    assert profile_gpu._child_lines(done.stdout)["times"].keys() >= {"import s"}
    assert set(profile_gpu.WARMUP_LIBRARY_SHAPES) == {s for s in app.WARMUP_SHAPES if s[1] > 32}
    assert gpu_proof.FIRST_CALL_S >= 2 * profile_gpu.FIRST_CALL_TIMEOUT_S


@pytest.mark.parametrize(("order", "said"), [("0", "at least 1"), ("-5", "at least 1"), ("x8", "not an integer")])
def test_a_fresh_process_refuses_a_matrix_order_that_is_not_positive(order, said):
    from bench import profile_gpu

    argv = [*profile_gpu.child_argv(8)[:-1], order]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and said in done.stderr and profile_gpu.MARK not in done.stdout


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_the_pivot_probe_tells_lapacks_measure_from_the_modulus(dtype):
    """The matrix the calibration factors on the device to name cuBLAS getrfBatched's complex pivot
    measure (40 x 40: a size the library routines get): LAPACK's first pivot (SciPy's, and the CPU
    backend's) is row 1 (|re| + |im|), the modulus's row 2."""
    import numpy as np
    import scipy.linalg

    import lu_core

    a = calibrate_gpu._measure_probe(dtype)
    assert a.shape == (1, calibrate_gpu.PROBE_N, calibrate_gpu.PROBE_N) and calibrate_gpu.PROBE_N > 32
    assert scipy.linalg.lu_factor(a)[1][0, 0] + 1 == 1 and lu_core.lu_factor(a)[1][0, 0] == 1
    assert int(np.argmax(np.abs(a[0, :, 0]))) + 1 == 2


def test_the_report_carries_the_pivot_comparison():
    rows = ["| routine | dtype | batch x n | matrices with LAPACK's pivots | measure (8x8 probe) |", "|---|---|---|---:|---|",
            "| getrfBatched | complex128 | 64 x 40 | 61 / 64 | modulus |"]  # fmt: skip
    text = calibrate_gpu.report("Test GPU", [], [], {}, rows)
    assert "## Pivots of the library routines against LAPACK's" in text and "| 61 / 64 | modulus |" in text
    assert "not measured" in calibrate_gpu.report("Test GPU", [], [], {}).split("## Pivots")[1]
