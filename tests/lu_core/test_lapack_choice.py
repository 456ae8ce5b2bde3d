"""The per-matrix LAPACK path on each LAPACK it can call (``LU_CORE_LAPACK``: MKL, SciPy's OpenBLAS).

The rest of the suite runs on the one the process picks (MKL on an Intel CPU where the ``mkl`` wheel
is installed, as ``make test`` installs it; SciPy's on other CPUs); here every LAPACK-path operation runs on both, forced onto LAPACK
at every size, and must agree: same pivots, the same answers within rounding, the same ``info`` for
singular matrices, and on each of them a matrix gets the same bits alone as inside a batch,
pooled (one thread per call) and threaded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator

import numpy as np
import pytest

import lu_core
from lu_core._cpu import _lapack, _mkl, _tuning
from tests.helpers import DTYPES, assert_close, cpu_path, random_matrix, well_conditioned

HAVE_MKL = _mkl.library_path() is not None
needs_mkl = pytest.mark.skipif(not HAVE_MKL, reason="the mkl wheel is not installed (pip install 'lu-service[mkl]')")


@contextlib.contextmanager
def using(lapack: _lapack.Lapack) -> Iterator[None]:
    saved = _lapack._chosen
    _lapack._chosen = lapack
    try:
        yield
    finally:
        _lapack._chosen = saved


def _providers() -> list:
    out = [pytest.param("scipy", id="scipy")]
    out.append(pytest.param("mkl", id="mkl", marks=needs_mkl))
    out.append(pytest.param("beside", id="openblas-mkl-beside", marks=needs_mkl))  # auto off Intel's CPUs
    return out


@pytest.fixture(scope="module")
def chosen() -> dict[str, _lapack.Lapack]:
    if not HAVE_MKL:
        return {"scipy": _lapack.choose("scipy")}
    mkl = _lapack.choose("mkl")
    return {"scipy": _lapack.choose("scipy"), "mkl": mkl, "beside": _lapack.Lapack(mkl)}


# ------------------------------------------------------------------ the choice


def test_choice_names_and_refusals(monkeypatch):
    assert type(_lapack.choose("scipy")) is _lapack.Lapack
    assert _lapack.choose(" SciPy ").name.startswith("SciPy (")
    with pytest.raises(ValueError, match=r"LU_CORE_LAPACK must be one of auto, mkl, scipy, not 'openblas'"):
        _lapack.choose("openblas")
    with pytest.raises(ValueError, match="LU_CORE_LAPACK") as info:
        _lapack.choose("x" * 10_000)
    assert len(str(info.value)) < 120  # the value is cut, not echoed in full
    monkeypatch.setattr(_lapack, "cpu_vendor", lambda: _lapack.INTEL)  # where auto would take MKL ...
    monkeypatch.setattr(_mkl, "library_path", lambda: None)  # ... but as without the wheel
    monkeypatch.setattr(_mkl, "_loaded", None)
    assert type(_lapack.choose("auto")) is _lapack.Lapack
    assert type(_lapack.choose("")) is _lapack.Lapack
    with pytest.raises(RuntimeError, match=r"pip install 'lu-service\[mkl\]'"):
        _lapack.choose("mkl")


@needs_mkl
def test_auto_takes_mkl_where_installed_and_the_process_keeps_its_choice(monkeypatch):
    monkeypatch.setattr(_lapack, "cpu_vendor", lambda: _lapack.INTEL)
    chosen = _lapack.choose("auto")
    assert isinstance(chosen, _lapack.MklLapack)
    assert chosen.name.startswith("MKL (Intel(R) oneAPI Math Kernel Library")
    assert chosen.name.endswith("; GNU threading layer)")  # Numba's OpenMP runtime, found here
    assert _mkl.load() is chosen.mkl  # one MKL per process: its layers are set once, before it computes
    monkeypatch.setattr(_lapack, "_chosen", None)
    monkeypatch.setenv("LU_CORE_LAPACK", "auto")
    first = _lapack.lapack()
    monkeypatch.setenv("LU_CORE_LAPACK", "scipy")  # read once: a later change does not switch mid-process
    assert _lapack.lapack() is first and isinstance(first, _lapack.MklLapack)


@needs_mkl
@pytest.mark.parametrize("vendor", ["AuthenticAMD", "HygonGenuine", "CentaurHauls"])
def test_auto_keeps_openblas_on_other_vendors_cpus_but_for_mkls_threaded_factors(monkeypatch, caplog, vendor):
    """MKL runs slower than OpenBLAS on AMD's CPUs but for its threaded ``getrf`` of float64 and complex
    matrices up to ``MKL_THREADED_FACTOR_MAX_N`` (``_tuning`` has the numbers): ``auto`` keeps SciPy's there with
    MKL beside it for those, says so in the log, and ``LU_CORE_LAPACK=mkl`` still gets MKL throughout."""
    monkeypatch.setattr(_lapack, "cpu_vendor", lambda: vendor)
    with caplog.at_level(logging.INFO, logger="lu_core._cpu._lapack"):
        chosen = _lapack.choose("auto")
    assert type(chosen) is _lapack.Lapack and isinstance(chosen.threaded_mkl, _lapack.MklLapack)
    assert chosen.threaded_mkl.mkl is _mkl.load()
    assert f"SciPy's LAPACK, faster than MKL off Intel's CPUs (this one is {vendor}), but for the" in caplog.text
    assert chosen.name.startswith("SciPy (") and f"; {_lapack.MKL_BESIDE} on MKL (" in chosen.name
    assert _lapack.MKL_BESIDE.startswith("threaded getrf of float64, complex64, complex128 matrices of n ")
    top = _tuning.MKL_THREADED_FACTOR_MAX_N
    low = max(_tuning.LAPACK_POOL_MAX_N + 1, _tuning.MKL_THREADED_FACTOR_MIN_N)
    for size, dtype, mkl in [(low, "float64", True), (top, "complex64", True), (top, "complex128", True),
                             (top + 1, "float64", False), (low - 1, "float64", False), (100, "complex128", False),
                             (low, "float32", False), (top, "float32", False)]:  # fmt: skip
        assert (chosen.threaded_factor(size, np.dtype(dtype)) is chosen.threaded_mkl) is mkl, (size, dtype)
    assert chosen.threaded_factor(top + 1, np.dtype("float64")) is chosen
    on_mkl = _lapack.choose("mkl")
    assert isinstance(on_mkl, _lapack.MklLapack) and on_mkl.threaded_factor(low, np.dtype("float32")) is on_mkl
    assert _lapack.choose("scipy").threaded_mkl is None  # scipy: OpenBLAS throughout


def test_auto_keeps_openblas_throughout_beside_an_mkl_on_one_thread(monkeypatch, caplog):
    """MKL on its SEQUENTIAL layer (no ``libgomp``, or ``MKL_THREADING_LAYER=SEQUENTIAL``) runs its "threaded"
    ``getrf`` on one thread, slower than OpenBLAS's threaded one: ``auto`` leaves it out on other vendors' CPUs."""

    class OneThread:
        threading_layer, version = "SEQUENTIAL", "MKL (a stand-in)"

    monkeypatch.setattr(_lapack, "cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr(_mkl, "load", lambda: OneThread())
    with caplog.at_level(logging.INFO, logger="lu_core._cpu._lapack"):
        chosen = _lapack.choose("auto")
    assert type(chosen) is _lapack.Lapack and chosen.threaded_mkl is None and "MKL" not in chosen.name
    assert "also for the threaded getrf (MKL runs on its SEQUENTIAL layer here)" in caplog.text
    monkeypatch.setattr(_lapack, "cpu_vendor", lambda: _lapack.INTEL)  # on Intel's, MKL throughout all the same
    assert isinstance(_lapack.choose("auto"), _lapack.MklLapack)


@needs_mkl
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64"])
def test_openblas_with_mkl_beside_factors_threaded_sizes_on_mkl_and_solves_on_openblas(rng, chosen, monkeypatch, dtype):
    """The split end to end: which library each call reaches (spied), and the same answers as OpenBLAS alone."""
    beside = chosen["beside"]
    calls: list[str] = []

    def spied(lp: _lapack.Lapack, name: str, method: str) -> None:
        real = getattr(lp, method)

        def wrapped(dt: np.dtype):
            fn = real(dt)

            def call(*args):
                calls.append(f"{name}.{method}")
                return fn(*args)

            return call

        monkeypatch.setattr(lp, method, wrapped)

    for lp, name in ((beside, "openblas"), (beside.threaded_mkl, "mkl")):
        for method in ("factor", "solve"):
            spied(lp, name, method)
    n = max(_tuning.LAPACK_POOL_MAX_N + 1, _tuning.MKL_THREADED_FACTOR_MIN_N) + 20
    A = well_conditioned(rng, (2, n, n), dtype)
    B = random_matrix(rng, (2, n, 3), dtype)
    with using(chosen["scipy"]):
        LU0, piv0 = lu_core.lu_factor(A)
    with using(beside):
        LU, piv = lu_core.lu_factor(A)
        X = lu_core.lu_solve(LU, piv, B)
        lu_core.lu_factor(A[:, :100, :100])  # a pooled size: OpenBLAS
    on_mkl = dtype != "float32"
    assert calls == [f"{'mkl' if on_mkl else 'openblas'}.factor"] * 2 + ["openblas.solve"] * 2 + ["openblas.factor"] * 2
    np.testing.assert_array_equal(piv, piv0)
    assert_close(LU, LU0, dtype, n, scale=float(np.abs(A).max()) * 4)
    assert_close(A @ X, B, dtype, n, scale=4 * n)


def test_auto_says_nothing_of_mkl_where_it_is_not_installed(monkeypatch, caplog):
    monkeypatch.setattr(_lapack, "cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr(_mkl, "library_path", lambda: None)
    monkeypatch.setattr(_mkl, "_loaded", None)  # as in a process without the wheel
    with caplog.at_level(logging.INFO, logger="lu_core._cpu._lapack"):
        auto = _lapack.choose("auto")
    assert type(auto) is _lapack.Lapack and auto.threaded_mkl is None
    assert "MKL" not in caplog.text and "MKL" not in auto.name


def test_the_cpu_vendor_is_read_from_cpuinfo(tmp_path):
    assert _lapack.auto_takes_mkl(_lapack.INTEL) and _lapack.auto_takes_mkl(None)
    assert not _lapack.auto_takes_mkl("AuthenticAMD")
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n")
    assert _lapack.cpu_vendor(str(info)) == "AuthenticAMD"
    info.write_text("processor\t: 0\nmodel name\t: ARMv8\n")  # no vendor line (an arm64 kernel)
    assert _lapack.cpu_vendor(str(info)) is None
    assert _lapack.cpu_vendor(str(tmp_path / "absent")) is None
    assert _lapack.cpu_vendor() in (None, "GenuineIntel", "AuthenticAMD", "HygonGenuine", "CentaurHauls")


@pytest.mark.parametrize("vendor", [_lapack.INTEL, "AuthenticAMD"])
def test_an_mkl_that_does_not_load_is_passed_over_by_auto_and_refused_by_mkl(monkeypatch, caplog, vendor):
    monkeypatch.setattr(_lapack, "cpu_vendor", lambda: vendor)

    def broken():
        raise RuntimeError("libmkl_core is missing beside libmkl_rt.so.3 (an incomplete MKL install)")

    monkeypatch.setattr(_mkl, "load", broken)
    with caplog.at_level(logging.WARNING, logger="lu_core._cpu._lapack"):
        auto = _lapack.choose("auto")
    assert type(auto) is _lapack.Lapack and auto.threaded_mkl is None
    assert "MKL is installed but does not load (libmkl_core is missing" in caplog.text
    with pytest.raises(RuntimeError, match="LU_CORE_LAPACK=mkl, but MKL does not load: libmkl_core is missing"):
        _lapack.choose("mkl")


@needs_mkl
def test_an_incomplete_mkl_is_refused_before_it_is_loaded(tmp_path, monkeypatch, caplog):
    """MKL loads its core, CPU and threading libraries lazily, and a missing one ends the process ("MKL
    FATAL ERROR"): they are looked for first. The installs are links to the real files, some left out."""
    real = os.path.dirname(_mkl.library_path())
    rt = os.path.basename(_mkl.library_path())

    def install(name: str, leave_out: str) -> str:
        folder = tmp_path / name
        folder.mkdir()
        for f in os.listdir(real):
            if f.startswith("libmkl_") and not f.startswith(leave_out):
                (folder / f).symlink_to(os.path.join(real, f))
        return str(folder / rt)

    with pytest.raises(RuntimeError, match="libmkl_core is missing beside libmkl_rt"):
        _mkl.Mkl(install("no-core", "libmkl_core"))
    monkeypatch.setenv("MKL_THREADING_LAYER", "intel")
    with caplog.at_level(logging.WARNING, logger="lu_core._cpu._mkl"):
        mkl = _mkl.Mkl(install("no-intel-layer", "libmkl_intel_thread"))  # the process's MKL, by another link
    assert "MKL_THREADING_LAYER=INTEL is not available here" in caplog.text
    assert mkl.threading_layer == _mkl.load().threading_layer == "GNU"


def test_dimensions_past_32_bits_and_refused_arguments_are_named_errors():
    _mkl._fits(2**31 - 1, 5)
    with pytest.raises(ValueError, match="2147483648 exceeds LAPACK's 32-bit integers"):
        _mkl._fits(3, 2**31)
    assert _mkl._checked(0, "getrf") == 0 and _mkl._checked(7, "getrf") == 7  # info > 0: a zero pivot, data
    with pytest.raises(RuntimeError, match="internal: MKL's getrs refused its argument 4"):
        _mkl._checked(-4, "getrs")


def test_environment_variable_is_read_at_the_first_call(monkeypatch):
    monkeypatch.setattr(_lapack, "_chosen", None)
    monkeypatch.setenv("LU_CORE_LAPACK", "scipy")
    assert type(_lapack.lapack()) is _lapack.Lapack
    monkeypatch.setattr(_lapack, "_chosen", None)
    monkeypatch.setenv("LU_CORE_LAPACK", "bogus")
    with pytest.raises(ValueError, match="LU_CORE_LAPACK"):
        lu_core.lu_factor(np.eye(_tuning.FACTOR_KERNEL_MAX_N + 1))


# ------------------------------------------------------------------ the same answers on both


@needs_mkl
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 40, 40), (2, 50, 30), (2, 30, 50), (1, 1, 1), (2, 130, 130)], ids=str)
def test_mkl_and_scipy_agree(rng, chosen, dtype, shape):
    A = random_matrix(rng, shape, dtype)
    out = {}
    with cpu_path("lapack"):
        for name in ("scipy", "mkl"):
            with using(chosen[name]):
                LU, piv, info = lu_core.lu_factor_ex(A)
                out[name] = (LU, piv, info)
                P, L, U = lu_core.lu_unpack(LU, piv)
                assert_close(P @ L @ U, A, dtype, max(shape[-2:]))
    np.testing.assert_array_equal(out["mkl"][1], out["scipy"][1])  # LAPACK's pivot rule on both
    np.testing.assert_array_equal(out["mkl"][2], out["scipy"][2])
    assert_close(out["mkl"][0], out["scipy"][0], dtype, max(shape[-2:]), scale=float(np.abs(A).max()) * 4)


@needs_mkl
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [False, True])
@pytest.mark.parametrize("nrhs", [1, 7])
def test_solves_agree(rng, chosen, dtype, left, adjoint, nrhs):
    n = 45
    A = well_conditioned(rng, (3, n, n), dtype)
    B = random_matrix(rng, (3, n, nrhs) if left else (3, nrhs, n), dtype)
    X = {}
    with cpu_path("lapack"):
        LU, piv = lu_core.lu_factor(A)
        for name in ("scipy", "mkl"):
            with using(chosen[name]):
                X[name] = lu_core.lu_solve(LU, piv, B, left=left, adjoint=adjoint)
                broadcast = lu_core.lu_solve(LU[:1], piv[:1], B, left=left, adjoint=adjoint)  # one LU, 3 systems
                Ah = A.conj().swapaxes(-1, -2) if adjoint else A
                assert_close(Ah @ X[name] if left else X[name] @ Ah, B, dtype, n, scale=4 * n)
                assert_close(broadcast[0], X[name][0], dtype, n, scale=4 * n)
    assert_close(X["mkl"], X["scipy"], dtype, n, scale=4 * n)


@needs_mkl
@pytest.mark.parametrize("dtype", DTYPES)
def test_singular_and_empty_agree(chosen, dtype):
    n = 40
    A = np.zeros((3, n, n), dtype)
    A[0] = np.eye(n)
    A[1] = np.eye(n)
    A[1][7, 7] = 0  # first zero pivot at column 8 (1-based)
    A[2][:, 3:] = 1  # its first column is zero: info 1
    E = np.zeros((0, n, n), dtype)
    with cpu_path("lapack"):
        outs = {}
        for name in ("scipy", "mkl"):
            with using(chosen[name]):
                outs[name] = lu_core.lu_factor_ex(A)
                LU, piv, info = lu_core.lu_factor_ex(E)
                assert LU.shape == (0, n, n) and piv.shape == (0, n) and info.shape == (0,)
                with pytest.raises(lu_core.SingularMatrixError):
                    lu_core.solve(A[1], np.ones(n, dtype))
    np.testing.assert_array_equal(outs["mkl"][2], outs["scipy"][2])
    assert outs["mkl"][2].tolist() == [0, 8, 1]
    np.testing.assert_array_equal(outs["mkl"][1], outs["scipy"][1])


# ------------------------------------------------------------------ alone = inside a batch, on each


def _bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x).tobytes()


@pytest.mark.parametrize("provider", _providers())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [32, 33, _tuning.LAPACK_POOL_MAX_N + 1, _tuning.MKL_THREADED_FACTOR_MIN_N + 1])
def test_alone_equals_inside_a_batch_on_each(rng, chosen, provider, dtype, n):
    """On MKL's GNU threading layer its thread count is per thread: a pool thread left at MKL's
    default (two threads) gave other bits for a 32 x 64 complex ``getrs`` than the calling thread, in
    some runs only (MKL's dynamic thread count): the next test pins the count itself."""
    size = 5 if n < 100 else 2
    A = well_conditioned(rng, (size, n, n), dtype)
    B = random_matrix(rng, (size, n, 64), dtype)
    with cpu_path("lapack"), using(chosen[provider]):
        LU, piv = lu_core.lu_factor(A)
        X = lu_core.lu_solve(LU, piv, B)
        XR = lu_core.lu_solve(LU, piv, B.swapaxes(-1, -2), left=False)
        for i in range(size):
            LUi, pivi = lu_core.lu_factor(A[i])
            assert _bits(LUi) == _bits(LU[i]) and _bits(pivi) == _bits(piv[i]), f"factor {i}"
            assert _bits(lu_core.lu_solve(LUi, pivi, B[i])) == _bits(X[i]), f"solve {i}"
            assert _bits(lu_core.lu_solve(LUi, pivi, B[i].T, left=False)) == _bits(XR[i]), f"right solve {i}"


@needs_mkl
def test_pool_threads_run_mkl_on_one_thread_and_give_it_back(chosen, monkeypatch):
    mkl = chosen["mkl"].mkl
    monkeypatch.setattr(_lapack, "_WORKERS", 2)  # the caller and one pool thread, whatever this machine's cores
    both = threading.Barrier(2, timeout=30)  # each worker's first grain waits for the other's: both run one
    seen: list[tuple[str, int]] = []

    pooled = [True]

    def task(lo: int, hi: int) -> None:
        if pooled[0]:
            both.wait()
        seen.append((threading.current_thread().name, mkl._lib.MKL_Get_Max_Threads()))

    count = mkl._lib.MKL_Get_Max_Threads
    before = count()  # this thread's (a threadpoolctl limit set here earlier is this thread's own)
    with using(chosen["mkl"]):
        _lapack._run_chunked(task, 2, _tuning.LAPACK_POOL_MAX_N)  # pooled: a grain of one matrix each
        assert {threads for _, threads in seen} == {1}, seen
        assert any(name.startswith("lu_core-lapack") for name, _ in seen), seen
        assert count() == before  # this thread's own count was given back
        seen.clear()
        pooled[0] = False
        _lapack._run_chunked(task, 1, _tuning.LAPACK_POOL_MAX_N + 1)  # threaded: MKL's own count
        assert seen == [(threading.current_thread().name, before)]
        if len(os.sched_getaffinity(0)) > 1:  # ... and the pool thread's count was given back too
            assert 1 not in {_lapack._pool.submit(count).result() for _ in range(4)}


@needs_mkl
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [45, _tuning.LAPACK_POOL_MAX_N + 44])
def test_mkl_rounds_the_same_at_every_alignment(rng, chosen, dtype, n):
    """Inside a batch a matrix starts at ``b * n * n * itemsize`` bytes, alone where NumPy's allocator put
    it: the bits must not depend on the address modulo a cache line (MKL's reproducibility conditions
    name alignment; on this machine kind it made no difference). One and 64 right-hand sides, each trans;
    n = 45 on one thread, as pooled calls run, and a threaded size on MKL's own count, as MKL factors it
    alone or beside OpenBLAS."""
    A = well_conditioned(rng, (n, n), dtype)
    B = random_matrix(rng, (n, 64), dtype)
    itemsize = np.dtype(dtype).itemsize
    factor, solve = chosen["mkl"].factor(np.dtype(dtype)), chosen["mkl"].solve(np.dtype(dtype))

    def at(x: np.ndarray, offset: int) -> np.ndarray:  # a column-major copy of x at offset bytes past 64
        raw = np.empty(x.nbytes + 128, np.uint8)
        start = (-raw.ctypes.data) % 64 + offset
        y = raw[start : start + x.nbytes].view(x.dtype).reshape(x.shape[::-1]).T
        y[...] = x
        return y

    results = []
    pooled = n <= _tuning.LAPACK_POOL_MAX_N
    previous = chosen["mkl"].mkl.set_local_threads(1 if pooled else 0)  # 0: the process's count
    for offset in range(0, 64, itemsize):
        lu, piv = at(A, offset), np.empty(n, np.int32)
        assert factor(lu, piv) == 0
        out = [lu.copy(), piv]
        for nrhs in (1, 64):
            for trans in (0, 1, 2):
                b = at(B[:, :nrhs], offset)
                solve(at(lu, (offset + itemsize) % 64), piv, b, trans)
                out.append(b.copy())
        results.append(b"".join(np.ascontiguousarray(x).tobytes() for x in out))
    chosen["mkl"].mkl.set_local_threads(previous)
    assert all(r == results[0] for r in results[1:]), "MKL's bits depend on the arrays' alignment"


# ------------------------------------------------------------------ bad input on each


@pytest.mark.parametrize("provider", _providers())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [40, _tuning.LAPACK_POOL_MAX_N + 1, _tuning.MKL_THREADED_FACTOR_MIN_N + 1])
def test_non_finite_matrices_on_each(rng, chosen, provider, dtype, n):
    """Infinities and NaNs reach LAPACK as they are: no crash, pivots in range, the same bits alone and
    in a batch but for NaNs' sign and payload (MKL's complex kernels gave a NaN of the other sign in some
    runs, alone against batched: one NaN as good as another), and NaN answers where the matrix holds a NaN.

    Not OpenBLAS's threaded real ``getrf`` (n > 256 here): with a NaN or an infinity in the matrix it chose
    other pivots for the same matrix at another address (inside a batch a matrix starts at ``b * n * n``
    elements, alone where the allocator put it), hence other bits; finite matrices round the same at every
    address (``test_alone_equals_inside_a_batch_on_each``). There only the finite matrix is compared."""

    def _bits(x: np.ndarray) -> bytes:  # NaNs made one NaN, every other bit as it is
        x = np.ascontiguousarray(x)
        if x.dtype.kind not in "fc":
            return x.tobytes()
        parts = x.view(x.real.dtype).copy()
        parts[np.isnan(parts)] = np.nan
        return parts.tobytes()

    A = well_conditioned(rng, (4, n, n), dtype)
    A[1, 3, 5] = np.inf
    A[2, 0, 0] = np.nan
    A[3, :, 2] = np.nan
    B = random_matrix(rng, (4, n, 3), dtype)
    with cpu_path("lapack"), using(chosen[provider]):
        LU, piv, _ = lu_core.lu_factor_ex(A)
        assert ((piv >= 1) & (piv <= n)).all()
        X = lu_core.lu_solve(LU, piv, B)
        lp = chosen[provider]
        openblas = n > _tuning.LAPACK_POOL_MAX_N and type(lp.threaded_factor(n, np.dtype(dtype))) is _lapack.Lapack
        for i in range(1 if openblas and np.dtype(dtype).kind == "f" else 4):
            LUi, pivi, _ = lu_core.lu_factor_ex(A[i])
            assert _bits(LUi) == _bits(LU[i]) and _bits(pivi) == _bits(piv[i])
            assert _bits(lu_core.lu_solve(LUi, pivi, B[i])) == _bits(X[i])
        assert np.isfinite(X[0]).all() and np.isnan(X[2]).any() and np.isnan(X[3]).any()


@pytest.mark.parametrize("provider", _providers())
@pytest.mark.parametrize("bad", [0, -1, 41, 2**31 - 1, -(2**31)])
def test_out_of_range_pivots_never_reach_lapack(rng, chosen, provider, bad):
    """``?getrs`` follows the pivots it is given: an out-of-range one would read and write outside the
    right-hand sides. The user's pivots are checked first, on each LAPACK."""
    n = 40
    A = well_conditioned(rng, (2, n, n), np.float64)
    with cpu_path("lapack"), using(chosen[provider]):
        LU, piv = lu_core.lu_factor(A)
        piv = piv.copy()
        piv[1, 17] = bad
        with pytest.raises(lu_core.PivotError, match="pivot"):
            lu_core.lu_solve(LU, piv, np.ones((2, n, 3)))
        with pytest.raises(lu_core.PivotError, match="pivot"):
            lu_core.lu_unpack(LU, piv)
