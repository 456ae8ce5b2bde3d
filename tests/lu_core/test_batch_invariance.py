"""A matrix gets the same bits alone as inside any batch, on every CPU path.

The service's dynamic batching merges concurrent requests into one call and must
answer each bit-identically to the request served alone. So the CPU backend's
choices (serial or parallel kernel twin, Numba kernel or LAPACK, LAPACK on the
pool with one BLAS thread or threaded BLAS one matrix at a time) may depend on
the matrix shape and dtype, never on the batch size; the one that does (small
real matrices factored eight at a time in SIMD lanes, the batch's last few one
by one) gives the same bits either way (also tests/lu_core/test_lanes.py). These tests put the same
matrices alone and at several places in batches large enough to take the
parallel twins, for every operation and dtype, at sizes on both sides of every
crossover in ``lu_core._cpu._tuning``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import lu_core
from lu_core._cpu import _tuning
from lu_core._cpu.backend import CPU_BACKEND
from tests.helpers import DTYPES, random_matrix, well_conditioned

# Square sizes around the crossovers: the SIMD-lane factor (<= LANES_MAX_N), kernel factor (<= FACTOR_KERNEL_MAX_N, complex
# <= FACTOR_KERNEL_COMPLEX_MAX_N), LAPACK on the pool (<= LAPACK_POOL_MAX_N), threaded
# LAPACK above it; the fused unpack (<= UNPACK_FUSED_MAX_N) and the split one; solve
# kernel and LAPACK getrs.
SIZES = sorted(
    {
        1,
        _tuning.LANES_MAX_N,
        _tuning.LANES_MAX_N + 1,
        _tuning.UNPACK_FUSED_MAX_N,
        _tuning.UNPACK_FUSED_MAX_N + 1,
        _tuning.FACTOR_KERNEL_COMPLEX_MAX_N,
        _tuning.FACTOR_KERNEL_COMPLEX_MAX_N + 1,
        _tuning.FACTOR_KERNEL_MAX_N,
        _tuning.FACTOR_KERNEL_MAX_N + 1,
        _tuning.SOLVE_KERNEL_REAL_MAX_N,
        _tuning.SOLVE_KERNEL_REAL_MAX_N + 1,
        _tuning.SOLVE_KERNEL_FLOAT32_MAX_N,
        _tuning.SOLVE_KERNEL_FLOAT32_MAX_N + 1,
        _tuning.SOLVE_KERNEL_OPENBLAS_SMALL_N,
        _tuning.SOLVE_KERNEL_OPENBLAS_SMALL_N + 1,
        _tuning.SOLVE_KERNEL_OPENBLAS_MAX_N,
        _tuning.SOLVE_KERNEL_OPENBLAS_MAX_N + 1,
        _tuning.LAPACK_POOL_MAX_N + 1,
    }
)


def _bits(x: np.ndarray | None) -> bytes | None:
    return None if x is None else np.ascontiguousarray(x).tobytes() + str(x.shape).encode()


def _batch_size(n: int, nrhs: int) -> int:
    """Enough matrices that a batched call crosses PARALLEL_MIN_WORK, capped for big n."""
    per = max(1, n**3 + n * n * nrhs)
    return int(min(max(4, 2 * _tuning.PARALLEL_MIN_WORK // per + 1), 3 if n > 64 else 10**4))


def _ops(n: int) -> dict[str, Callable[[np.ndarray, np.ndarray], tuple]]:
    def factored(fn):
        def run(a, b):
            LU, piv = lu_core.lu_factor(a)
            return fn(LU, piv, a, b)

        return run

    return {
        "lu_factor": lambda a, b: lu_core.lu_factor(a),
        "lu_factor_ex": lambda a, b: lu_core.lu_factor_ex(a),
        "lu": lambda a, b: lu_core.lu(a),
        "lu_unpack": factored(lambda LU, piv, a, b: lu_core.lu_unpack(LU, piv)),
        "lu_solve": factored(lambda LU, piv, a, b: (lu_core.lu_solve(LU, piv, b),)),
        "lu_solve_1": factored(lambda LU, piv, a, b: (lu_core.lu_solve(LU, piv, b[..., :1]),)),
        "lu_solve_adjoint": factored(lambda LU, piv, a, b: (lu_core.lu_solve(LU, piv, b, adjoint=True),)),
        "lu_solve_right": factored(lambda LU, piv, a, b: (lu_core.lu_solve(LU, piv, b.swapaxes(-1, -2), left=False),)),
        "solve": lambda a, b: (lu_core.solve(a, b),),
        "solve_vector": lambda a, b: (lu_core.solve(a, b[..., 0]),),
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_alone_equals_inside_a_batch(rng, dtype, n):
    nrhs = 64 if n <= 64 else 3
    size = _batch_size(n, nrhs)
    A = well_conditioned(rng, (size, n, n), dtype)
    B = _rhs(rng, (size, n, nrhs), dtype)
    picks = sorted({0, size // 2, size - 1}) if n <= 64 else [size - 1]
    ops = _ops(n)
    if n > 64:  # LAPACK at threaded sizes: the operations whose path changes there, to keep this quick
        ops = {k: ops[k] for k in ("lu_factor_ex", "lu_solve", "lu_solve_right", "solve")}
    for name, op in ops.items():
        batched = op(A, B)
        for i in picks:
            alone = op(A[i], B[i])
            one = op(A[i : i + 1], B[i : i + 1])
            for out_b, out_a, out_1 in zip(batched, alone, one, strict=True):
                ref = _bits(None if out_b is None else out_b[i])
                assert _bits(out_a) == ref, f"{name}: matrix {i} alone differs from the batch of {size}"
                assert _bits(None if out_1 is None else out_1[0]) == ref, f"{name}: matrix {i} in a batch of 1"


def _rhs(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    return random_matrix(rng, shape, dtype)


@contextlib.contextmanager
def _twin(kind: str) -> Iterator[None]:
    saved = _tuning.PARALLEL_MIN_WORK
    _tuning.PARALLEL_MIN_WORK = 0 if kind == "parallel" else 1 << 62
    try:
        yield
    finally:
        _tuning.PARALLEL_MIN_WORK = saved


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "n", [3, _tuning.UNPACK_FUSED_MAX_N + 3, _tuning.FACTOR_KERNEL_COMPLEX_MAX_N, _tuning.FACTOR_KERNEL_MAX_N]
)
def test_serial_and_parallel_twins_give_the_same_bits(rng, dtype, n):
    """The same batch through each twin of every kernel (forced both ways)."""
    A = well_conditioned(rng, (5, n, n), dtype)
    A_c = np.asfortranarray(A.transpose(1, 2, 0)).transpose(2, 0, 1)  # neither C nor column-major per matrix
    B = _rhs(rng, (5, n, 7), dtype)
    results = {}
    for kind in ("serial", "parallel"):
        with _twin(kind):
            out = []
            for name, op in _ops(n).items():
                out += [(name, _bits(x)) for x in op(A, B)]
            out += [("strided", _bits(x)) for x in lu_core.lu_factor(A_c)]
            LU, piv = lu_core.lu_factor(A)
            out += [("perm", _bits(lu_core.pivots_to_permutation(piv, n)))]
            out += [("broadcast", _bits(lu_core.lu_solve(LU[:1], piv[:1], B)))]
            results[kind] = out
    for (name, s), (_, p) in zip(results["serial"], results["parallel"], strict=True):
        assert s == p, f"{name}: the serial and parallel twins differ"


def test_nonfinite_entries_keep_bits_alone_and_batched(rng):
    """Infinities and NaNs (and exact zeros, which skip updates) follow the same path alone and batched."""
    A = well_conditioned(rng, (300, 6, 6), np.float64)
    A[7, 2, 3] = np.inf
    A[8, :, 1] = 0.0
    A[9, 0, 0] = np.nan
    B = _rhs(rng, (300, 6, 2), np.float64)
    B[7] = 0.0
    LU, piv, _ = lu_core.lu_factor_ex(A)
    X = lu_core.lu_solve(LU, piv, B)
    for i in (7, 8, 9):
        LU1, piv1, _ = lu_core.lu_factor_ex(A[i])
        assert _bits(LU1) == _bits(LU[i])
        assert _bits(piv1) == _bits(piv[i])
        assert _bits(lu_core.lu_solve(LU1, piv1, B[i])) == _bits(X[i])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "n",
    sorted(
        {
            1,
            8,
            16,
            17,
            40,
            _tuning.FACTOR_KERNEL_COMPLEX_MAX_N,  # the fused kernel's last complex size ...
            _tuning.FACTOR_KERNEL_COMPLEX_MAX_N + 1,  # ... and the first composed one
            _tuning.FACTOR_KERNEL_MAX_N,
            _tuning.FACTOR_KERNEL_MAX_N + 1,
        }
    ),
)
# 5 right-hand sides: the kernel for any dtype (n * nrhs <= 768); 64: the kernel for real n <= 96 and, beside MKL,
# float32 n <= 128 (SOLVE_KERNEL_REAL_MAX_N, SOLVE_KERNEL_FLOAT32_MAX_N, SOLVE_KERNEL_OPENBLAS_*), else getrs.
@pytest.mark.parametrize("nrhs", [5, 64])
def test_solve_equals_factor_then_solve(rng, dtype, n, nrhs):
    """``solve`` gives the bits of ``lu_factor`` then ``lu_solve``, for matrices and vectors, ``left`` both
    ways, and a right-hand side batch broadcast over ``A``'s: of ``A^T``, solved adjointly, where the CPU
    backend says so (a real ``A`` that LAPACK's ``getrs`` solves, as ``torch.linalg.solve`` does: LAPACK
    factors a row-major ``A^T`` after a plain copy), else of ``A``."""
    A = well_conditioned(rng, (6, n, n), dtype)
    B = _rhs(rng, (3, 6, n, nrhs), dtype)
    LU, piv = lu_core.lu_factor(A)
    LUt, pivt = lu_core.lu_factor(A.swapaxes(-1, -2))

    def composed(b: np.ndarray, left: bool = True) -> np.ndarray:
        k = (b if left else b.swapaxes(-1, -2)).shape[-1]
        if CPU_BACKEND.solve_by_transpose(n, k, np.dtype(dtype)):
            return lu_core.lu_solve(LUt, pivt, b, left=left, adjoint=True)
        return lu_core.lu_solve(LU, piv, b, left=left)

    cases = {
        "matrix": (lu_core.solve(A, B[0]), composed(B[0])),
        "vector": (lu_core.solve(A, B[0, ..., 0]), composed(B[0, ..., :1])[..., 0]),
        "right": (lu_core.solve(A, B[0].swapaxes(-1, -2), left=False), composed(B[0].swapaxes(-1, -2), left=False)),
        "broadcast": (lu_core.solve(A, B), composed(B)),
    }
    for name, (fused, expected) in cases.items():
        same = _bits(fused) == _bits(expected)  # not in the assert: pytest would diff megabytes of bytes
        assert same, f"{name}: solve differs from lu_factor + lu_solve (max |diff| {np.abs(fused - expected).max()})"


@pytest.mark.parametrize("batch", [1, 5])
def test_lapack_calls_hold_blas_to_one_thread_and_restore_it(rng, batch, scipy_lapack):
    """The LAPACK path runs BLAS single-threaded (same bits alone and in a batch) and leaves the
    caller's BLAS thread count as it found it, on success and on failure."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from lu_core._cpu import _lapack

    _skip_without_blas()
    n = _tuning.FACTOR_KERNEL_MAX_N + 8  # past the kernels: LAPACK
    A = well_conditioned(rng, (batch, n, n), np.float64)
    seen: list[list[int]] = []
    with threadpool_limits(limits=2, user_api="blas"):
        before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
        LU, piv = lu_core.lu_factor(A)
        assert _lapack._blas  # found with the pool: the checks below are not vacuous
        X = lu_core.lu_solve(LU, piv, np.ones((batch, n, 70)))
        np.testing.assert_allclose(A @ X, np.ones((batch, n, 70)), atol=1e-8)
        assert [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"] == before

    def task(lo: int, hi: int) -> None:
        seen.append([lib.get_num_threads() for lib in _lapack._blas])
        raise RuntimeError("inside")

    with threadpool_limits(limits=2, user_api="blas"):
        with pytest.raises(RuntimeError, match="inside"):
            _lapack._run_chunked(task, 1, n)
        assert all(lib.get_num_threads() == 2 for lib in _lapack._blas)
    assert seen and all(t == [1] * len(_lapack._blas) for t in seen)


def test_one_pooled_size_matrix_is_held_to_one_blas_thread_too(rng, scipy_lapack, monkeypatch):
    """One matrix of the pool's sizes goes straight to getrf (``_direct``), held to one BLAS thread as the pool
    holds it (OpenBLAS's two-thread getrf rounds otherwise), the caller's count given back after, also when
    getrf fails; on a pthreads OpenBLAS the hold calls its C functions, looked up once."""
    import ctypes

    from threadpoolctl import threadpool_limits

    from lu_core._cpu import _lapack

    _skip_without_blas()
    n = _tuning.FACTOR_KERNEL_MAX_N + 8
    lu_core.lu_factor(well_conditioned(rng, (n, n), np.float64))  # the controllers are found
    for lib, (get, set_) in zip(_lapack._blas, _lapack._blas_threads, strict=True):
        if lib.internal_api == "openblas" and lib.threading_layer == "pthreads":
            assert isinstance(get, ctypes._CFuncPtr) and isinstance(set_, ctypes._CFuncPtr)
    seen: list[list[int]] = []
    real = _lapack.get_lapack_funcs

    def spying(names, dtype=None):
        (fn,) = real(names, dtype=dtype)

        def call(*args, **kwargs):
            seen.append(_blas_threads())
            if args[0][0, 0] == 7:
                raise RuntimeError("inside getrf")
            return fn(*args, **kwargs)

        return (call,)

    monkeypatch.setattr(_lapack, "get_lapack_funcs", spying)
    monkeypatch.setattr(_lapack._chosen, "_alone", {})  # built again, around the spy
    A = well_conditioned(rng, (n, n), np.float64)
    with threadpool_limits(limits=2, user_api="blas"):
        LU, piv = lu_core.lu_factor(A)
        P, L, U = lu_core.lu_unpack(LU, piv)
        np.testing.assert_allclose(P @ L @ U, A, atol=1e-10)
        assert _blas_threads() == [2] * len(_lapack._blas)
        A[0, 0] = 7
        with pytest.raises(RuntimeError, match="inside getrf"):
            lu_core.lu_factor(A)
        assert _blas_threads() == [2] * len(_lapack._blas)
    assert len(seen) == 2 and all(t == [1] * len(_lapack._blas) for t in seen)


@pytest.fixture
def scipy_lapack(monkeypatch):
    """SciPy's LAPACK for the test: these check the process-wide BLAS hold, which is SciPy's OpenBLAS's
    (MKL, where installed, is held per thread: tests/lu_core/test_lapack_choice.py)."""
    from lu_core._cpu import _lapack

    monkeypatch.setattr(_lapack, "_chosen", _lapack.choose("scipy"))


def _skip_without_blas() -> None:
    from threadpoolctl import ThreadpoolController

    if not ThreadpoolController().select(user_api="blas").lib_controllers:
        pytest.skip("threadpoolctl finds no BLAS library to hold to one thread")


def _blas_threads() -> list[int]:
    from lu_core._cpu import _lapack

    return [lib.get_num_threads() for lib in _lapack._blas]


def test_concurrent_lapack_calls_keep_one_blas_thread_until_the_last_is_done(scipy_lapack):
    """BLAS's thread count is the process's: a call that ends while another thread's call still runs
    LAPACK must not give BLAS its threads back under it."""
    import threading

    from threadpoolctl import threadpool_limits

    from lu_core._cpu import _lapack

    _skip_without_blas()
    n = _tuning.FACTOR_KERNEL_MAX_N + 8
    lu_core.lu_factor(np.eye(n)[None])  # finds the BLAS libraries
    assert _lapack._blas
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[list[int]] = []

    def first(lo: int, hi: int) -> None:  # enters first, leaves first
        first_in.set()
        assert second_in.wait(10)

    def second(lo: int, hi: int) -> None:  # enters while the first runs, runs on after it has left
        second_in.set()
        assert first_out.wait(10)
        seen.append(_blas_threads())

    errors: list[BaseException] = []

    def run(task) -> None:
        try:
            _lapack._run_chunked(task, 1, n)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    with threadpool_limits(limits=2, user_api="blas"):
        a = threading.Thread(target=run, args=(first,))
        a.start()
        assert first_in.wait(10)
        b = threading.Thread(target=run, args=(second,))
        b.start()
        a.join(10)
        first_out.set()
        b.join(10)
        assert not errors, errors
        assert seen == [[1] * len(_lapack._blas)]
        assert all(t == 2 for t in _blas_threads())  # the last one out restored the caller's count


@pytest.mark.parametrize("failing", ["caller", "pool"])
def test_a_failed_grain_waits_for_the_others_before_blas_gets_its_threads_back(monkeypatch, failing, scipy_lapack):
    """A grain that fails (on the calling thread or on a pool thread) while the other worker is inside
    its own grain: the call raises that error only once the other grain has ended, BLAS still at one
    thread for it, and no further grain starts."""
    import threading
    import time

    from threadpoolctl import threadpool_limits

    from lu_core._cpu import _lapack

    _skip_without_blas()
    n = _tuning.FACTOR_KERNEL_MAX_N + 8
    lu_core.lu_factor(np.eye(n)[None])
    assert _lapack._blas
    monkeypatch.setattr(_lapack, "_WORKERS", 2)  # the caller and one pool thread, whatever this machine's cores
    caller = threading.get_ident()
    seen: list[list[int]] = []
    started: list[int] = []
    other_in = threading.Event()

    def task(lo: int, hi: int) -> None:
        started.append(lo)
        if (threading.get_ident() == caller) == (failing == "caller"):
            assert other_in.wait(10)  # the other worker is inside its grain
            raise RuntimeError("failed grain")
        other_in.set()
        time.sleep(0.5)  # still running LAPACK when the other grain has failed
        seen.append(_blas_threads())

    with threadpool_limits(limits=2, user_api="blas"):
        with pytest.raises(RuntimeError, match="failed grain"):
            _lapack._run_chunked(task, 8, n)  # grains of one matrix: six never start
        assert seen == [[1] * len(_lapack._blas)]
        assert all(t == 2 for t in _blas_threads())
    assert len(started) == 2


def test_a_refused_pool_thread_leaves_no_grain_behind(monkeypatch):
    """When the pool refuses work partway (interpreter shutdown, no thread to start), the call raises
    and no grain of it runs afterwards: workers already handed their task find it stopped."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from lu_core._cpu import _lapack

    _lapack._controllers()  # the pool exists (a lone matrix of its sizes does not go through it)
    monkeypatch.setattr(_lapack, "_WORKERS", 3)
    gate = threading.Event()
    pool = ThreadPoolExecutor(max_workers=1)
    pool.submit(gate.wait, 10)  # holds its thread, so the first worker's task waits in the queue
    submitted = 0

    def submit(fn, *args):
        nonlocal submitted
        submitted += 1
        if submitted == 2:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")
        return pool.submit(fn, *args)

    monkeypatch.setattr(_lapack._pool, "submit", submit)
    ran: list[int] = []
    with pytest.raises(RuntimeError, match="cannot schedule"):
        _lapack._run_chunked(lambda lo, hi: ran.append(lo), 6, 8)
    gate.set()
    pool.shutdown(wait=True)
    assert ran == []


def test_pool_workers_take_grains_in_turn_so_a_slow_core_does_less(monkeypatch):
    """Every matrix is done exactly once, and a worker that is held up (on a machine, by a core that
    another process or the service's event loop takes) does fewer grains instead of holding the call
    up until a fixed share of the batch is through: here the worker that takes the first grain is
    held there until the other one has done the last."""
    import threading

    from lu_core._cpu import _lapack

    monkeypatch.setattr(_lapack, "_WORKERS", 2)
    count = 64
    done: list[tuple[int, int, int]] = []
    last_done = threading.Event()

    def task(lo: int, hi: int) -> None:
        if lo == 0:
            assert last_done.wait(10), "the other worker did not take the rest of the batch"
        done.append((threading.get_ident(), lo, hi))
        if hi == count:
            last_done.set()

    _lapack._run_chunked(task, count, 8)
    covered = sorted(i for _, lo, hi in done for i in range(lo, hi))
    assert covered == list(range(count))
    slow = next(t for t, lo, _ in done if lo == 0)
    assert sum(hi - lo for t, lo, hi in done if t == slow) <= count // 4, done


_SHARED_PIVOTS = """
import numpy as np, lu_core
from lu_core._cpu import _lapack, _tuning
_lapack._WORKERS = 2  # the caller and a pool thread taking grains of one matrix, whatever this machine's cores
_lapack._workers = lambda: 2
n = _tuning.SOLVE_KERNEL_REAL_MAX_N + 1  # LAPACK getrs on the pool, real and complex
assert n <= _tuning.LAPACK_POOL_MAX_N
rng = np.random.default_rng(0)
for dtype in (np.complex128, np.float64):
    A = (rng.standard_normal((n, n)) + n * np.eye(n)).astype(dtype)
    B = rng.standard_normal((40, n, 64)).astype(dtype)
    LU, piv = lu_core.lu_factor(A)
    alone = [lu_core.lu_solve(LU, piv, b).tobytes() for b in B]
    for _ in range(30):
        X = lu_core.lu_solve(LU, piv, B)  # every right-hand side shares the one factorization's pivots
        assert [x.tobytes() for x in X] == alone, "a broadcast solve differs from the same systems alone"
print("same")
"""


def test_pool_threads_sharing_one_factorization_get_the_bits_of_one_at_a_time():
    """Right-hand sides broadcast over one factorization, solved by LAPACK on two threads at once,
    get the bits each gets alone. SciPy's ``?getrs`` wrapper rewrites the pivot array it is given in
    place (to 1-based and back) around the LAPACK call: two threads handed one array corrupted the
    pivots (other bits, and heap corruption that aborted the process). Run in a subprocess, since the
    failure it guards against can take the interpreter down."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _SHARED_PIVOTS], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "same", (
        out.returncode,
        out.stdout[-2000:],
        out.stderr[-2000:],
    )
