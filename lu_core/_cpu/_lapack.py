"""Per-matrix LAPACK (MKL's, else SciPy's OpenBLAS: ``LU_CORE_LAPACK``) over a batch of large matrices.

Each matrix is big enough that a call's overhead is noise. Matrices up to
``_tuning.LAPACK_POOL_MAX_N`` are cut into grains (about 16 per worker) that the calling
thread and a thread pool take in turn (SciPy's LAPACK wrappers release the GIL), with BLAS
held to one thread so the cores are not oversubscribed. Larger ones are done one
after another with BLAS's own threads. The choice depends on the matrix size
(and for the threaded factor, the dtype: :meth:`Lapack.threaded_factor`) only, never on the batch size, because
OpenBLAS's threaded and serial ``getrf`` round differently: a matrix gets the same bits alone as inside any batch
(when one Python thread calls at a time: the one-BLAS-thread setting is the process's,
held from the first concurrent call's start to the last one's end). Limits, with
several Python threads calling at once: a large matrix that OpenBLAS factors (BLAS threaded inside)
while another thread is in a pooled batch runs with one BLAS thread, so other bits (not one that MKL factors:
its count is the calling thread's own);
and an OpenBLAS built on OpenMP (not SciPy's wheels, which use pthreads) takes the
count per calling thread, which this module does not handle. The service calls
lu_core from one worker thread. One more limit, OpenBLAS's own: its threaded real ``getrf`` chose other
pivots for a matrix holding a NaN or an infinity at another address (inside a batch a matrix starts at
``b * n * n`` elements, alone where the allocator put it), so such a matrix can get other bits alone than in a
batch; finite matrices round the same at every address (``tests/lu_core/test_lapack_choice.py``).

Arrays follow the CPU backend's storage: ``s[b]`` is the transposed matrix,
so ``s[b].T`` is the Fortran-ordered matrix LAPACK wants, with no copy.
Pivots here are 0-based int32 (as SciPy's wrappers give them; MKL's 1-based ones are shifted).

Which LAPACK: ``LU_CORE_LAPACK`` read at the first call, ``auto`` (the default: MKL on an Intel CPU
where the ``mkl`` wheel is installed and loads, see ``_mkl``, else SciPy's), ``mkl`` (an error without
it) or ``scipy``. ``auto`` keeps SciPy's on other vendors' CPUs: on a 2-vCPU AMD EPYC with AVX2 (no
AVX-512), one thread, OpenBLAS's ``getrf`` took 0.48-0.77x MKL's time from n = 128 to 1024 (1.0x at
float64 1024) and its ``getrs`` with 64 right-hand sides 0.30-0.83x, and over the core grid's cells
from n = 128 lu_core on OpenBLAS had 12 ratios to the best peer above 1.2 where on MKL it had 22
(``README.md``, Performance). There MKL, where installed, still factors what its threaded ``getrf`` does
faster than OpenBLAS's: float64 and complex matrices of ``_tuning.MKL_THREADED_FACTOR_MIN_N`` to
``MKL_THREADED_FACTOR_MAX_N`` (:meth:`Lapack.threaded_factor`; one 512 x 512 float64 matrix 0.59-0.64x
OpenBLAS's time). Both follow LAPACK's pivot rule (first largest ``|re| + |im|``); their
rounding differs, so a process keeps its choice for its lifetime, by size and dtype. The size rule above
holds for both; the pooled calls (and a lone matrix of a pooled size, :meth:`Lapack.factor_alone`) are held
to one thread differently: SciPy's OpenBLAS through its process-wide count, set through the libraries
threadpoolctl finds (:func:`_one_blas_thread`, with the limits above for concurrent callers), MKL per calling thread
(:meth:`MklLapack.one_thread`; on its GNU OpenMP layer the count is the thread's own), so MKL's pooled
calls leave the process's BLAS setting and other threads' large matrices alone.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np
from scipy.linalg import get_lapack_funcs
from threadpoolctl import ThreadpoolController

from lu_core._cpu import _kernels, _mkl, _tuning

#: ``LU_CORE_LAPACK``'s values.
CHOICES = ("auto", "mkl", "scipy")

log = logging.getLogger(__name__)

_lock = threading.Lock()
_blas_counter = threading.Lock()  # guards _blas_users and _blas_saved (below)
_pool: ThreadPoolExecutor | None = None
_blas: list = []  # threadpoolctl's controllers of the loaded BLAS libraries, found with the pool
_blas_threads: list[tuple[Callable[[], Any], Callable[[int], object]]] = []  # their (get, set), resolved with it
_chosen: Lapack | None = None


class Lapack:
    """The LAPACK this process calls: ``factor(dtype)`` gives ``f(a, piv0) -> info`` (``a`` column-major,
    factored in place; 0-based pivots into the contiguous ``piv0``), ``solve(dtype)`` gives
    ``f(lu, piv0, b, trans) -> None`` (``b`` column-major, overwritten; ``piv0`` left as it is)."""

    #: Whether pooled calls hold it to one thread through the process's BLAS setting (:func:`_one_blas_thread`).
    process_wide = True
    #: MKL, for the threaded ``getrf`` of the sizes and dtypes where it beats this one (:meth:`threaded_factor`).
    threaded_mkl: MklLapack | None = None

    def __init__(self, threaded_mkl: MklLapack | None = None) -> None:
        self.name = f"SciPy ({_scipy_lapack()})"
        self._alone: dict[np.dtype, Callable[[np.ndarray, np.ndarray], int]] = {}
        if threaded_mkl is not None:
            self.threaded_mkl = threaded_mkl
            self.name += f"; {MKL_BESIDE} on {threaded_mkl.name}"

    def threaded_factor(self, size: int, dtype: np.dtype) -> Lapack:
        """The LAPACK that factors a matrix with ``max(m, n) == size``: this one, or MKL where ``LU_CORE_LAPACK=auto``
        put it beside OpenBLAS (a CPU not Intel's) and the size and dtype are those where MKL's threaded ``getrf``
        wins there (``_tuning.MKL_THREADED_FACTOR_*``). From the size and dtype only, so a matrix gets the same
        bits alone as inside any batch."""
        mkl = self.threaded_mkl
        if mkl is not None and dtype.name in _tuning.MKL_THREADED_FACTOR_DTYPES and _in_mkl_band(size):
            return mkl
        return self

    def factor(self, dtype: np.dtype) -> Callable[[np.ndarray, np.ndarray], int]:
        (fn,) = get_lapack_funcs(("getrf",), dtype=dtype)

        def call(a: np.ndarray, piv0: np.ndarray) -> int:
            lu, p, info = fn(a, overwrite_a=1)
            if not np.shares_memory(lu, a):  # pragma: no cover - SciPy copied
                a[...] = lu
            piv0[...] = p
            return info

        return call

    def factor_alone(self, dtype: np.dtype) -> Callable[[np.ndarray, np.ndarray], int]:
        """``f(a, ipiv) -> info`` for one matrix of a pooled size factored by itself (``_direct``): ``factor``
        held to one thread around the call as a pooled call is (:meth:`_hold`: so the same bits), LAPACK's
        1-based pivots into ``ipiv``, and none of the pool's dispatch. One 128 x 128 float64 ``lu_factor``:
        on MKL (2-vCPU Intel Xeon) 109 -> 88 us warm, 694 -> 518 us on its first call after a 20 ms pause
        (PyTorch 102 and 526); on OpenBLAS (2-vCPU AMD EPYC, the core grid's harness) median 1.24 -> 1.14x
        PyTorch's time (``README.md``, Performance)."""
        call = self._alone.get(dtype)
        if call is None:
            factor, hold, release = self.factor(dtype), self._hold, self._release

            def call(a: np.ndarray, ipiv: np.ndarray) -> int:
                held = hold()
                try:
                    info = factor(a, ipiv)
                finally:
                    release(held)
                ipiv += 1  # this module's 0-based -> LAPACK's 1-based, as lu_factor returns them
                return info

            self._alone[dtype] = call
        return call

    def _hold(self) -> Any:
        """Hold this LAPACK to one thread for a call on this thread, until :meth:`_release` of what this
        returns: SciPy's OpenBLAS through the process's count (:func:`_one_blas_thread`), as the pool holds it."""
        _controllers()
        _one_blas_thread()

    def _release(self, held: Any) -> None:
        _restore_blas_threads()

    def solve(self, dtype: np.dtype) -> Callable[[np.ndarray, np.ndarray, np.ndarray, int], None]:
        (fn,) = get_lapack_funcs(("getrs",), dtype=dtype)

        def call(lu: np.ndarray, piv0: np.ndarray, b: np.ndarray, trans: int) -> None:
            # A copy of the pivots for every call: SciPy's ?getrs wrapper turns the array it is given
            # into LAPACK's 1-based pivots in place, calls LAPACK with the GIL released, then turns
            # it back. Right-hand sides broadcast over one factorization share one pivot row, and two
            # pool threads doing that to one array at once left out-of-range pivots for LAPACK to
            # follow (other bits; heap corruption, measured).
            x, _ = fn(lu, piv0.copy(), b, trans=trans, overwrite_b=1)
            if not np.shares_memory(x, b):  # pragma: no cover - SciPy copied
                b[...] = x

        return call

    def one_thread(self, task: Callable[[int, int], None]) -> Callable[[int, int], None]:
        """``task`` with this LAPACK held to one thread in the thread that runs it, where that is not
        the process's BLAS setting (which :func:`_one_blas_thread` holds for SciPy's OpenBLAS)."""
        return task


class MklLapack(Lapack):
    """MKL's ``?getrf``/``?getrs`` (``_mkl``), on the same arrays, which must be column-major."""

    process_wide = False

    def __init__(self, mkl: _mkl.Mkl) -> None:
        self.mkl = mkl
        self._alone = {}
        self.name = f"MKL ({mkl.version}; {mkl.threading_layer} threading layer)"

    def _hold(self) -> int:
        """MKL's count of this thread at one (``mkl_set_num_threads_local``): its previous count."""
        return self.mkl.set_local_threads(1)

    def _release(self, held: int) -> None:
        self.mkl.set_local_threads(held)

    def one_thread(self, task: Callable[[int, int], None]) -> Callable[[int, int], None]:
        hold, release = self._hold, self._release

        def run(lo: int, hi: int) -> None:
            held = hold()
            try:
                task(lo, hi)
            finally:
                release(held)

        return run

    def factor(self, dtype: np.dtype) -> Callable[[np.ndarray, np.ndarray], int]:
        getrf = self.mkl.getrf(dtype)

        def call(a: np.ndarray, piv0: np.ndarray) -> int:
            _column_major(a)
            info = getrf(a, piv0)
            piv0 -= 1  # 1-based -> this module's 0-based (a few integers against an O(n^3) call)
            return info

        return call

    def solve(self, dtype: np.dtype) -> Callable[[np.ndarray, np.ndarray, np.ndarray, int], None]:
        getrs = self.mkl.getrs(dtype)

        def call(lu: np.ndarray, piv0: np.ndarray, b: np.ndarray, trans: int) -> None:
            _column_major(lu, b)
            getrs(lu, piv0 + 1, b, trans)  # a 1-based copy: rows of piv0 are shared by broadcast solves

        return call


def _column_major(*arrays: np.ndarray) -> None:
    for a in arrays:
        if not a.flags.f_contiguous:  # pragma: no cover - _lapack's callers always pass transposed C storage
            raise ValueError("internal: MKL is given a matrix that is not column-major")


def lapack() -> Lapack:
    """The LAPACK this process calls, chosen by ``LU_CORE_LAPACK`` at the first call and kept."""
    global _chosen
    if _chosen is None:
        with _lock:
            if _chosen is None:
                _chosen = choose(os.environ.get("LU_CORE_LAPACK", "auto"))
    return _chosen


def choose(choice: str) -> Lapack:
    """The LAPACK for ``LU_CORE_LAPACK=choice`` (loading MKL if it is chosen, or under ``auto`` beside SciPy's on
    other vendors' CPUs, for :meth:`Lapack.threaded_factor`). Under ``auto`` an MKL that is installed but does not
    load (a broken or over-pruned install) is logged and passed over."""
    choice = choice.strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(f"LU_CORE_LAPACK must be one of {', '.join(CHOICES)}, not {choice[:40]!r}")
    if choice == "scipy":
        return Lapack()
    beside = choice == "auto" and not auto_takes_mkl(vendor := cpu_vendor())  # OpenBLAS, MKL beside it
    try:
        mkl = _mkl.load()
    except (OSError, AttributeError, RuntimeError) as exc:
        if choice == "mkl":
            raise RuntimeError(f"LU_CORE_LAPACK=mkl, but MKL does not load: {exc}") from exc
        log.warning("MKL is installed but does not load (%s): large matrices go to SciPy's LAPACK", exc)
        return Lapack()
    if beside and mkl is not None:
        if mkl.threading_layer == "SEQUENTIAL":  # one thread: slower than OpenBLAS's threaded getrf, as it is here
            log.info("LU_CORE_LAPACK=auto: SciPy's LAPACK, faster than MKL off Intel's CPUs (this one is %s), also "
                     "for the threaded getrf (MKL runs on its SEQUENTIAL layer here)", vendor)  # fmt: skip
            return Lapack()
        log.info("LU_CORE_LAPACK=auto: SciPy's LAPACK, faster than MKL off Intel's CPUs (this one is %s), but for "
                 "the %s, MKL's (LU_CORE_LAPACK=mkl takes MKL throughout)", vendor, MKL_BESIDE)  # fmt: skip
        return Lapack(MklLapack(mkl))
    if mkl is not None:
        return MklLapack(mkl)
    if choice == "mkl":
        raise RuntimeError("LU_CORE_LAPACK=mkl, but the mkl wheel is not installed: pip install 'lu-service[mkl]'")
    return Lapack()


INTEL = "GenuineIntel"


def _in_mkl_band(size: int) -> bool:
    """Whether MKL beside OpenBLAS factors matrices with ``max(m, n) == size`` (of its dtypes): always past the
    pool's sizes, whose calls run one thread each (OpenBLAS's faster there)."""
    low = max(_tuning.LAPACK_POOL_MAX_N + 1, _tuning.MKL_THREADED_FACTOR_MIN_N)
    return low <= size <= _tuning.MKL_THREADED_FACTOR_MAX_N


#: What MKL factors beside OpenBLAS (:meth:`Lapack.threaded_factor`), as the LAPACK's name and the log say it.
MKL_BESIDE = (
    f"threaded getrf of {', '.join(_tuning.MKL_THREADED_FACTOR_DTYPES)} matrices of n "
    f"{max(_tuning.LAPACK_POOL_MAX_N + 1, _tuning.MKL_THREADED_FACTOR_MIN_N)} to {_tuning.MKL_THREADED_FACTOR_MAX_N}"
)


def cpu_vendor(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The CPU's vendor as the kernel names it (``GenuineIntel``, ``AuthenticAMD``, ...), or None where
    there is no ``/proc/cpuinfo`` to tell (not Linux: no ``mkl`` wheel either) or it names none."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip() or None
    except OSError:
        return None
    return None


def auto_takes_mkl(vendor: str | None) -> bool:
    """Whether ``LU_CORE_LAPACK=auto`` takes an installed MKL on a CPU of this vendor (:func:`cpu_vendor`):
    on Intel's, and where no vendor is named (no ``/proc/cpuinfo``)."""
    return vendor in (None, INTEL)


def _scipy_lapack() -> str:
    """What SciPy's LAPACK was built against (``scipy-openblas`` in its wheels)."""
    try:
        import scipy

        found = scipy.show_config(mode="dicts")["Build Dependencies"]["lapack"]
        return f"{found['name']} {found.get('version', '')}".strip()
    except Exception:  # pragma: no cover - an older SciPy without the build record
        return "its LAPACK"


def _workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


_WORKERS = _workers()  # the cores this process may use, read once


#: A pool call is cut into about this many grains per worker, which the workers (the calling thread
#: among them) take in turn as they finish the last: a core that another process, or the service's
#: event loop, slows down takes fewer of them instead of holding the whole call up at a fixed half.
_GRAINS_PER_WORKER = 16


def _run_chunked(task: Callable[[int, int], None], count: int, n: int, lp: Lapack | None = None) -> None:
    """``task(lo, hi)`` over ``range(count)`` cut into grains, on the pool's threads and the calling
    thread, with ``lp`` (the task's LAPACK; default :func:`lapack`) held to one thread; for ``n`` past
    ``LAPACK_POOL_MAX_N``, one call on this thread with BLAS threaded. Every grain has ended, or will
    never start, before this returns or raises (the calling thread's exception if it failed, else the
    first failed pool worker's)."""
    if n > _tuning.LAPACK_POOL_MAX_N:
        task(0, count)  # one matrix at a time, BLAS threaded inside each
        return
    _controllers()
    lp = lp or lapack()
    workers = min(_WORKERS, count)
    task = lp.one_thread(task)
    held = False
    try:
        # One thread even for a single matrix, so that it rounds as it would in a batch.
        if lp.process_wide:
            _one_blas_thread()
            held = True
        if workers <= 1:
            task(0, count)
            return
        _share(task, count, workers)
    finally:
        if held:
            _restore_blas_threads()


def _controllers() -> None:
    """Find the BLAS libraries' thread controllers and start the pool, once (the first pooled or lone call)."""
    global _pool, _blas
    if _pool is None:
        with _lock:
            if _pool is None:
                # Not the MKL lu_core loads itself (``_mkl``): its count is per thread (MklLapack.one_thread).
                own = _mkl.loaded_path()
                blas = ThreadpoolController().select(user_api="blas").lib_controllers
                _blas = [lib for lib in blas if own is None or os.path.realpath(lib.filepath) != own]
                _blas_threads[:] = [_thread_functions(lib) for lib in _blas]
                _pool = ThreadPoolExecutor(max_workers=_workers(), thread_name_prefix="lu_core-lapack")


def _share(task: Callable[[int, int], None], count: int, workers: int) -> None:
    """Grains of ``range(count)`` to this thread and ``workers - 1`` pool threads, each taking the next
    as it finishes the last; returns or raises only once no grain runs or can start any more."""
    grain = max(1, count // (workers * _GRAINS_PER_WORKER))
    grains = itertools.count(0, grain)  # next() on it is atomic under the GIL: each grain goes to one worker
    stop = threading.Event()

    def work() -> None:
        try:
            while not stop.is_set() and (lo := next(grains)) < count:
                task(lo, min(lo + grain, count))
        except BaseException:
            stop.set()  # the other workers take no further grain
            raise

    futures: list[Future] = []
    try:
        for _ in range(workers - 1):
            futures.append(_pool.submit(work))
        work()
    finally:
        stop.set()  # on the way out for any reason (a failure, an interrupt, a refused submit): no new grain
        running = [f for f in futures if not f.cancel()]  # a worker that has not started never will
        interrupted: BaseException | None = None
        while True:  # until every grain has ended (at most one per worker), even through an interrupt
            try:
                wait(running)
                break
            except BaseException as exc:  # the wait is resumed; the first interrupt is raised after it
                interrupted = interrupted or exc
        if interrupted is not None:
            raise interrupted
    for f in running:
        f.result()


# BLAS's thread count is the process's: several Python threads in _run_chunked at once share one setting.
# The first to enter saves the counts and sets one thread, the last to leave restores them.
_blas_users = 0
_blas_saved: list[tuple[Callable[[int], object], int]] = []


def _thread_functions(lib: Any) -> tuple[Callable[[], Any], Callable[[int], object]]:
    """The library's own thread-count getter and setter.

    The setter is not threadpoolctl's ``set_num_threads``: threadpoolctl (>= 3.6) lets only one Python thread,
    the first that set a limit, change an OpenBLAS built on pthreads, and silently ignores the others; the
    thread that calls lu_core (the service's worker) may not be that one, and the count above already
    coordinates the threads that call here. For such an OpenBLAS both are its C functions, looked up here
    once: threadpoolctl's methods look them up on every call (~1 us each; a hold makes up to four per library).
    """
    get, set_ = lib.get_num_threads, getattr(lib, "_real_set_num_threads", None) or lib.set_num_threads
    symbol = getattr(lib, "_get_symbol", None)
    if lib.internal_api == "openblas" and getattr(lib, "threading_layer", None) == "pthreads" and symbol:
        c_get, c_set = symbol("openblas_get_num_threads"), symbol("openblas_set_num_threads")
        if c_get is not None and c_set is not None:
            return c_get, c_set
    return get, set_


def _one_blas_thread() -> None:
    """Every BLAS library at one thread until the matching :func:`_restore_blas_threads`.

    What ``ThreadpoolController.limit(limits=1, user_api="blas")`` does, to the libraries it finds (found
    once; for a pthreads OpenBLAS through its own C functions, :func:`_thread_functions`), without its
    bookkeeping: that costs ~25 us a call, more than ``getrs`` of one 32x32 matrix (5 us); this, 2.9 us
    with the matching restore (two OpenBLAS libraries loaded, NumPy's and SciPy's). Counted, so that concurrent callers
    (the service's worker beside a thread of its own, say) keep one thread until the last
    of them is done.
    """
    global _blas_users, _blas_saved
    with _blas_counter:
        _blas_users += 1
        if _blas_users == 1:
            _blas_saved = [(set_threads, get_threads()) for get_threads, set_threads in _blas_threads]
            for set_threads, threads in _blas_saved:
                if threads != 1:
                    set_threads(1)


def _restore_blas_threads() -> None:
    global _blas_users, _blas_saved
    with _blas_counter:
        _blas_users -= 1
        if _blas_users == 0:
            saved, _blas_saved = _blas_saved, []
            for set_threads, threads in saved:
                if threads != 1:
                    set_threads(threads)


def _copied_ahead(src: np.ndarray | None, transposed: bool, dst: np.ndarray, size: int) -> np.ndarray | None:
    """``src``, for each pool thread to copy its own matrices into ``dst`` (transposing them when
    ``transposed``), or None once ``dst`` is filled here: where matrices of ``size`` run one after
    another on this thread with BLAS threaded inside, the parallel kernel copies them all first
    (2048 x 2048 float64: 4.1 ms against 7.8 on one core)."""
    if src is None or size <= _tuning.LAPACK_POOL_MAX_N:
        return src
    if transposed:
        _kernels.transpose_into(src.size, src, dst)
    else:
        np.copyto(dst, src)
    return None


def getrf(
    s: np.ndarray, piv0: np.ndarray, info: np.ndarray, src: np.ndarray | None = None, transposed: bool = False
) -> None:
    """Factor every ``s[b].T`` in place with ``?getrf``, after copying ``src[b]`` into ``s[b]`` when given.

    ``src`` as in :func:`lu_core._cpu._kernels.getrf`: ``src[b]`` is the matrix itself,
    C-ordered, when ``transposed`` (it is transposed into ``s[b]``), else already in
    transposed storage. Each matrix is copied by the thread that factors it, just before, so
    that LAPACK finds it in cache and, on the pool, the copies run on every core (100 x 128
    x 128 float64: 6.0 ms against 9.5 with one transposing copy of the whole batch first).
    """
    size = max(s.shape[1:])
    lp = lapack().threaded_factor(size, s.dtype)
    factor = lp.factor(s.dtype)
    src = _copied_ahead(src, transposed, s, size)

    def task(lo: int, hi: int) -> None:
        for b in range(lo, hi):
            if src is not None:
                _copy_in(src, transposed, s, b)
            info[b] = factor(s[b].T, piv0[b])

    _run_chunked(task, s.shape[0], size, lp)


def _copy_in(src: np.ndarray, transposed: bool, s: np.ndarray, b: int) -> None:
    """``s[b]`` from ``src[b]`` as :func:`getrf` takes it (transposing a C-ordered matrix, serially)."""
    if transposed:
        _kernels.transpose_into.serial(src[b : b + 1], s[b : b + 1])
    else:
        s[b] = src[b]


def getrf_alone(src: np.ndarray, transposed: bool, m: int, n: int) -> tuple[np.ndarray, np.ndarray, int]:
    """:func:`getrf` of one ``m x n`` matrix of the pool's sizes (``src`` holds it, as :func:`getrf` takes
    it): ``(s, piv, info)``, the factorization in transposed storage ``(1, n, m)`` and LAPACK's 1-based
    pivots ``(1, min(m, n))``, from the same copy and the same single-threaded ``getrf``
    (:meth:`Lapack.factor_alone`), hence the same bits, without the pool's dispatch."""
    lp = lapack()
    s = np.empty((1, n, m), dtype=src.dtype)
    piv = np.empty((1, min(m, n)), dtype=np.int32)
    _copy_in(src, transposed, s, 0)
    return s, piv, lp.factor_alone(s.dtype)(s[0].T, piv[0])


def getrs(
    s: np.ndarray, piv0: np.ndarray, lu_index: np.ndarray, w: np.ndarray, trans: int, src: np.ndarray | None = None
) -> None:
    """Solve in place on ``w[t].T`` with factorization ``lu_index[t]``;
    ``trans`` is 0 (A), 1 (A^T) or 2 (A^H). With ``src`` (C-contiguous, ``src[t] == w[t].T``
    wanted), each ``src[t]`` is first transposed into ``w[t]`` by the thread that solves it."""
    lp = lapack()
    solve = lp.solve(s.dtype)
    transpose = _kernels.transpose_into.serial
    src = _copied_ahead(src, True, w, s.shape[-1])

    def task(lo: int, hi: int) -> None:
        for t in range(lo, hi):
            if src is not None:
                transpose(src[t : t + 1], w[t : t + 1])
            j = lu_index[t]
            solve(s[j].T, piv0[j], w[t].T, trans)

    _run_chunked(task, w.shape[0], s.shape[-1], lp)
