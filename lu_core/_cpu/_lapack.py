"""Per-matrix LAPACK (through SciPy) over a batch of large matrices.

Each matrix is big enough that a call's overhead is noise. Matrices up to
``_tuning.LAPACK_POOL_MAX_N`` are cut into grains (about 16 per worker) that the calling
thread and a thread pool take in turn (SciPy's LAPACK wrappers release the GIL), with BLAS
held to one thread so the cores are not oversubscribed. Larger ones are done one
after another with BLAS's own threads. The choice depends on the matrix size
only, never on the batch size, because OpenBLAS's threaded and serial ``getrf``
round differently: a matrix gets the same bits alone as inside any batch (when
one Python thread calls at a time: the one-BLAS-thread setting is the process's,
held from the first concurrent call's start to the last one's end). Limits, with
several Python threads calling at once: a large matrix (BLAS threaded inside) factored
while another thread is in a pooled batch runs with one BLAS thread, so other bits;
and an OpenBLAS built on OpenMP (not SciPy's wheels, which use pthreads) takes the
count per calling thread, which this module does not handle. The service calls
lu_core from one worker thread.

Arrays follow the CPU backend's storage: ``s[b]`` is the transposed matrix,
so ``s[b].T`` is the Fortran-ordered matrix LAPACK wants, with no copy.
Pivots here are LAPACK's as SciPy gives them: 0-based int32.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np
from scipy.linalg import get_lapack_funcs
from threadpoolctl import ThreadpoolController

from lu_core._cpu import _kernels, _tuning

_lock = threading.Lock()
_blas_counter = threading.Lock()  # guards _blas_users and _blas_saved (below)
_pool: ThreadPoolExecutor | None = None
_blas: list = []  # threadpoolctl's controllers of the loaded BLAS libraries, found with the pool


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


def _run_chunked(task: Callable[[int, int], None], count: int, n: int) -> None:
    """``task(lo, hi)`` over ``range(count)`` cut into grains, on the pool's threads and the calling
    thread, with BLAS held to one thread; for ``n`` past ``LAPACK_POOL_MAX_N``, one call on this
    thread with BLAS threaded. Every grain has ended, or will never start, before this returns or
    raises (the calling thread's exception if it failed, else the first failed pool worker's)."""
    global _pool, _blas
    if n > _tuning.LAPACK_POOL_MAX_N:
        task(0, count)  # one matrix at a time, BLAS threaded inside each
        return
    if _pool is None:
        with _lock:
            if _pool is None:
                _blas = ThreadpoolController().select(user_api="blas").lib_controllers
                _pool = ThreadPoolExecutor(max_workers=_workers(), thread_name_prefix="lu_core-lapack")
    workers = min(_WORKERS, count)
    try:
        # One BLAS thread even for a single matrix, so that it rounds as it would in a batch.
        _one_blas_thread()
        if workers <= 1:
            task(0, count)
            return
        _share(task, count, workers)
    finally:
        _restore_blas_threads()


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


def _setter(lib: Any) -> Callable[[int], object]:
    """The library's own thread-count setter. threadpoolctl (>= 3.6) lets only one Python thread, the first
    that set a limit, change an OpenBLAS built on pthreads, and silently ignores the others: the thread that
    calls lu_core (the service's worker) may not be that one, and the count above already coordinates
    the threads that call here."""
    return getattr(lib, "_real_set_num_threads", None) or lib.set_num_threads


def _one_blas_thread() -> None:
    """Every BLAS library at one thread until the matching :func:`_restore_blas_threads`.

    What ``ThreadpoolController.limit(limits=1, user_api="blas")`` does, through the same
    library controllers (found once), without its bookkeeping: that costs ~25 us a call,
    more than ``getrs`` of one 32x32 matrix (5 us). Counted, so that concurrent callers
    (the service's worker beside a thread of its own, say) keep one thread until the last
    of them is done.
    """
    global _blas_users, _blas_saved
    with _blas_counter:
        _blas_users += 1
        if _blas_users == 1:
            _blas_saved = [(_setter(lib), lib.get_num_threads()) for lib in _blas]
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
    (fn,) = get_lapack_funcs(("getrf",), dtype=s.dtype)
    transpose = _kernels.transpose_into.serial
    src = _copied_ahead(src, transposed, s, max(s.shape[1:]))

    def task(lo: int, hi: int) -> None:
        for b in range(lo, hi):
            if src is not None:
                if transposed:
                    transpose(src[b : b + 1], s[b : b + 1])
                else:
                    s[b] = src[b]
            view = s[b].T
            lu, p, inf = fn(view, overwrite_a=1)
            if not np.shares_memory(lu, view):  # pragma: no cover - SciPy copied
                view[...] = lu
            piv0[b] = p
            info[b] = inf

    _run_chunked(task, s.shape[0], max(s.shape[1:]))


def getrs(
    s: np.ndarray, piv0: np.ndarray, lu_index: np.ndarray, w: np.ndarray, trans: int, src: np.ndarray | None = None
) -> None:
    """Solve in place on ``w[t].T`` with factorization ``lu_index[t]``;
    ``trans`` is 0 (A), 1 (A^T) or 2 (A^H). With ``src`` (C-contiguous, ``src[t] == w[t].T``
    wanted), each ``src[t]`` is first transposed into ``w[t]`` by the thread that solves it."""
    (fn,) = get_lapack_funcs(("getrs",), dtype=s.dtype)
    transpose = _kernels.transpose_into.serial
    src = _copied_ahead(src, True, w, s.shape[-1])

    def task(lo: int, hi: int) -> None:
        for t in range(lo, hi):
            if src is not None:
                transpose(src[t : t + 1], w[t : t + 1])
            j = lu_index[t]
            rhs = w[t].T
            # A copy of the pivots for every call: SciPy's ?getrs wrapper turns the array it is given
            # into LAPACK's 1-based pivots in place, calls LAPACK with the GIL released, then turns
            # it back. Right-hand sides broadcast over one factorization share ``piv0[j]``, and two
            # pool threads doing that to one array at once left out-of-range pivots for LAPACK to
            # follow (other bits; heap corruption, measured).
            x, _ = fn(s[j].T, piv0[j].copy(), rhs, trans=trans, overwrite_b=1)
            if not np.shares_memory(x, rhs):  # pragma: no cover - SciPy copied
                rhs[...] = x

    _run_chunked(task, w.shape[0], s.shape[-1])
