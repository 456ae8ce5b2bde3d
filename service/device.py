"""Which device computes, and how arrays reach it and come back.

``LU_DEVICE=auto`` takes the GPU when CuPy is installed and sees one, and
otherwise the CPU, saying why in the log and in ``/readyz``. ``LU_DEVICE=gpu``
refuses to start without a GPU. The worker thread calls :meth:`Device.run` (the
CPU, and the small jobs a GPU computes on the host), or :meth:`Device.launch` and the
job's ``compute()`` and ``result()`` (the GPU's other jobs, :meth:`Device.overlapped`,
so that another job's upload can run in between): on the GPU that copies NumPy inputs
in once on the worker's upload stream, computes with CuPy arrays (``lu_core`` dispatches
on them) and copies the results out once. Outputs wrapped in :class:`Resident` stay where they were computed (the
factorization store keeps them on the device).

Device memory is bounded here, not in the routes. ``LU_GPU_MEMORY_BYTES`` (default
80% of the device's memory at start) is the limit of CuPy's device pool, and
``LU_GPU_PINNED_BYTES`` caps the pinned host memory: staging buffers, download buffers and the
body pool's page-locked receive buffers (:mod:`service.pinning`: an input that lies in one is
uploaded from where it arrived, without staging). Before a job
is queued, :meth:`Device.check_fits` refuses a request whose need, known from its
shapes, can never fit, or does not fit beside the stored factorizations the device
holds (503 ``device_out_of_memory`` with ``Retry-After``, nothing uploaded). An
allocation failure during a job (CuPy's ``OutOfMemoryError``, a cuSOLVER/cuBLAS
workspace) is caught in :meth:`Device.run` (for a launched job, by the worker, which
first retries once beside no job in flight): the pools' free blocks are released and
the request gets the same 503; the next request starts from a clean pool. The base
class holds this logic, so the CPU stand-ins of the tests exercise the same code as
the GPU.
"""

from __future__ import annotations

import collections
import ctypes
import importlib.metadata
import logging
import math
import platform
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from lu_core._gpu import _tuning as _gpu_tuning  # the GPU dispatch table: plain Python, no CuPy import
from service.config import Settings
from service.errors import ServiceError, unavailable
from service.pinning import BodyPinner

if TYPE_CHECKING:
    from service.metrics import Metrics

__all__ = [
    "CpuDevice",
    "Device",
    "DeviceUnavailableError",
    "GpuDevice",
    "Launched",
    "Resident",
    "gpu_problem",
    "read_only",
    "select_device",
]

log = logging.getLogger("service.device")

# LU_GPU_MEMORY_BYTES when unset: the rest is left to cuSOLVER/cuBLAS handles, the CUDA
# context and other processes' needs (nvidia-smi, a profiler).
DEFAULT_MEMORY_FRACTION = 0.8
_HOST_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every CUDA context

Compute = Callable[[Mapping[str, Any], Mapping[str, bool]], dict[str, Any]]
T = TypeVar("T")


#: Operations whose GPU routines, for matrices our small-matrix kernels take, compute each matrix
#: the same whatever the batch: the factorization (``small_getrf``), the solve (``small_getrs``) and
#: the unpacking (element-wise). Not ``det`` / ``slogdet``: their products and sums are CuPy reductions,
#: whose order may follow the array's size.
_GPU_MERGEABLE = frozenset({"lu_factor", "lu", "lu_unpack", "lu_solve", "solve"})


#: Stateless operations a GPU service may compute on the host for small matrices (LU_GPU_HOST_MAX_N).
_HOST_OPERATIONS = frozenset({"lu_factor", "lu", "lu_unpack", "lu_solve", "solve", "det", "slogdet"})

#: A request of more work than this goes to the device even when its matrices are small: matrices x m x n
#: x min(m, n) for the factorization, plus every other input's elements x max(m, n) (a right-hand side's
#: solve): 8192 matrices of 8 x 8, 128 of 32 x 32, or one 32 x 32 system with 4096 right-hand sides. A
#: guess (a host factorization of that size takes about a device round trip, ~1 ms); to be measured.
HOST_MAX_WORK = 1 << 22


def host_sized(name: str, tensors: Mapping[str, Any], max_n: int) -> bool:
    """Whether a GPU service computes this job on the host: a stateless operation on host arrays whose
    matrices (``A`` or ``LU``) are at most ``max_n`` in both dimensions and whose work is at most
    ``HOST_MAX_WORK``. ``tensors`` may hold the parts of a merged call (lists): the batcher merges only
    jobs of equal shapes (``service.batcher.signature``), so the first part is one request's and the
    merged call goes where each of its requests alone would, and answers what they alone would."""
    if name not in _HOST_OPERATIONS or not max_n:
        return False
    matrix = tensors.get("A", tensors.get("LU"))
    if isinstance(matrix, list):  # the parts of a merged call, one per request
        matrix = matrix[0] if matrix else None
    if not isinstance(matrix, np.ndarray) or matrix.ndim < 2:
        return False
    if not all(isinstance(t, np.ndarray | list) for t in tensors.values()):
        return False  # an input already on the device (a stored factorization's)
    m, n = matrix.shape[-2:]
    if max(m, n) > max_n:
        return False
    others = 0
    for key, t in tensors.items():
        if key not in ("A", "LU"):
            others += (t[0] if isinstance(t, list) and t else t).size  # B: its elements, one request's
    return math.prod(matrix.shape[:-2]) * m * n * min(m, n) + others * max(m, n) <= HOST_MAX_WORK


def gpu_merges(name: str, tensors: Mapping[str, np.ndarray]) -> bool:
    """On a GPU, merged answers are bit-identical to the job's alone only where ``lu_core`` runs our own
    kernels, chosen from the matrix's size: above them cuBLAS ``getrfBatched`` or a cuSOLVER call per
    matrix, and ``getrsBatched``, ``trsmBatched`` or cuSOLVER ``getrs``, are chosen from the batch count
    (``lu_core/_gpu/_factor.py``, ``_solve.py``). Those jobs run alone."""
    if name not in _GPU_MERGEABLE:
        return False
    matrix = tensors.get("A", tensors.get("LU"))
    if matrix is None or matrix.ndim < 2:
        return False
    if name == "lu_unpack":
        return True  # element-wise kernels, any size
    return max(matrix.shape[-2:]) <= min(_gpu_tuning.SMALL_FACTOR_MAX_N, _gpu_tuning.SMALL_SOLVE_MAX_N)


class DeviceUnavailableError(RuntimeError):
    """``LU_DEVICE=gpu`` was asked for and no GPU is usable, or the CPU's LAPACK (``LU_CORE_LAPACK``) cannot
    be the one asked for: the service does not start (exit 2)."""


class Resident:
    """An output that :meth:`Device.run` hands back where it was computed, without copying it out."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def read_only(tensors: Mapping[str, Any]) -> dict[str, Any]:
    """``tensors`` with every writable host array replaced by a read-only view of it.

    Numba compiles each CPU kernel once per writability of its arrays. A binary request's tensors
    are read-only already (views of its body); a JSON request's, a merged batch's and a stored
    factorization's are made so here, on their way to the computation (which never writes its
    inputs: a binary request would fail if it did), so that one build of each kernel serves every
    request and the warm-up compiles half as many (cold, on a 2-vCPU Intel Xeon, for the same four
    operations: 106 s, not 174)."""
    out = dict(tensors)
    for k, v in out.items():
        if isinstance(v, np.ndarray) and v.flags.writeable:
            view = v.view()
            view.flags.writeable = False
            out[k] = view
    return out


def operation_name(compute: Compute) -> str:
    """The operation a compute function serves (``service.operations`` keeps the core names)."""
    return getattr(compute, "__name__", "unknown").lstrip("_")


class Device:
    """The CPU, and the base of every device: memory bounds, out-of-memory recovery, stage timing.

    Parameters
    ----------
    note
        Why ``LU_DEVICE=auto`` chose the CPU, if it did.
    memory_limit
        Bytes the device may hold for requests (None: unbounded). The GPU sets its pool's
        limit; tests give CPU stand-ins one to exercise :meth:`check_fits`.
    retry_after_s
        ``Retry-After`` of a ``device_out_of_memory`` answer.
    """

    kind = "cpu"

    def __init__(self, note: str | None = None, *, memory_limit: int | None = None, retry_after_s: int = 1) -> None:
        self.note = note  # why auto chose the CPU, if it did
        self.memory_limit = memory_limit
        self.pinned_limit: int | None = None
        self.retry_after_s = retry_after_s
        self.metrics: Metrics | None = None
        self._stage_children: dict[tuple[str, str], Any] = {}
        # Bytes that stay on the device between requests (the factorization store sets it): a
        # request has the limit less these.
        self.resident_bytes: Callable[[], int] = lambda: 0

    @property
    def name(self) -> str:
        return platform.processor() or platform.machine()

    def attach_metrics(self, metrics: Metrics) -> None:
        """Report device memory and per-stage device time into ``metrics``."""
        self.metrics = metrics
        self._stage_children = {}
        metrics.watch_device_memory(self)

    def thread_init(self) -> None:
        """Called once on the worker thread before its first job."""

    # ------------------------------------------------------------------ memory

    def memory_in_use(self) -> int:
        """Bytes the device holds for requests now (the pool's used bytes on a GPU)."""
        return 0

    def pinned_in_use(self) -> int:
        """Bytes of pinned host memory held for staging."""
        return 0

    def check_fits(self, nbytes: int, what: str, *, resident: int = 0) -> None:
        """Refuse, before anything is uploaded, a request that does not fit in the device's memory.

        Stored factorizations stay on the device (:attr:`resident_bytes`); the jobs before
        this one have ended when it runs, so only the stored bytes are taken from the limit.
        (On a device that :attr:`overlaps`, one job may still be in flight; when the two do not
        fit together, the worker lets that one finish and starts this one again.)
        ``resident``: the part of ``nbytes`` already there (a stored factorization the request
        uses), which must not count twice.

        Raises
        ------
        ServiceError
            503 ``device_out_of_memory`` with ``Retry-After`` when ``nbytes`` exceeds the limit
            (``lu_rejected_total{reason="device_memory_limit"}``), or the limit less the stored
            factorizations' bytes (``reason="device_memory_stored"``: it fits once some are
            deleted, expire or are evicted).
        """
        limit = self.memory_limit
        if limit is None:
            return
        if nbytes > limit:
            reason, why = "device_memory_limit", f"the limit (LU_GPU_MEMORY_BYTES) is {limit}: send a smaller batch"
        else:
            stored = self.resident_bytes()
            if nbytes - resident <= limit - stored:
                return
            reason = "device_memory_stored"
            why = (
                f"{stored} of the {limit} bytes (LU_GPU_MEMORY_BYTES) hold stored factorizations: retry later, "
                "or DELETE some /factorizations"
            )
        if self.metrics is not None:
            self.metrics.rejected.labels(reason).inc()
        raise self._out_of_memory(
            f"{what} needs at least {nbytes} bytes of {self.kind} memory for its inputs and outputs; {why}"
        )

    def _out_of_memory(self, message: str) -> ServiceError:
        return unavailable("device_out_of_memory", message, self.retry_after_s)

    def is_out_of_memory(self, exc: BaseException) -> bool:
        return isinstance(exc, MemoryError)

    def release_memory(self) -> None:
        """Give cached memory back after an out-of-memory error."""

    def body_pinner(self) -> BodyPinner | None:
        """What page-locks the body pool's idle buffers for this device (:mod:`service.pinning`); None on the CPU."""
        return None

    # ------------------------------------------------------------------ running a job

    #: Whether a job is started in steps (:meth:`launch`: inputs queued for upload; ``compute()``;
    #: ``result()``: the outputs downloaded), so that the worker may upload the next job's inputs
    #: before it collects this one's answer (transfers overlapped across requests). The CPU computes
    #: a job whole: collecting its answer later would only delay it.
    overlaps = False

    def overlapped(self, compute: Compute, tensors: Mapping[str, Any]) -> bool:
        """Whether this job is started in steps (:attr:`overlaps`); a GPU computes small jobs whole, on
        the host (``LU_GPU_HOST_MAX_N``): nothing to overlap, and an answer held back for the next job."""
        return self.overlaps

    def merges(self, name: str, tensors: Mapping[str, np.ndarray]) -> bool:
        """Whether this job may be merged with others into one call (service.batcher): only where the
        merged answer is bit-identical to the job's alone. On the CPU always: ``lu_core`` chooses every
        routine from a matrix's shape and dtype, never from the batch."""
        return True

    def run(self, compute: Compute, tensors: Mapping[str, np.ndarray], options: Mapping[str, bool]) -> dict[str, Any]:
        """Compute one job on the device; an allocation failure becomes 503 ``device_out_of_memory``."""
        return self._guarded(compute, self._execute, compute, tensors, options)

    def launch(self, compute: Compute, tensors: Mapping[str, np.ndarray], options: Mapping[str, bool]) -> Launched:
        """Start one job in steps (see :attr:`overlaps`): call ``compute()`` then ``result()`` on what this
        returns. On a device that overlaps, unlike :meth:`run`, no step turns an allocation failure into a
        503: the caller (the worker) does, once, after it may have retried. Here the job runs whole, through
        :meth:`run`, before this returns."""
        return Launched(self.run(compute, tensors, options))

    def launch_stacked(
        self,
        compute: Compute,
        parts: Mapping[str, Sequence[np.ndarray]],
        options: Mapping[str, bool],
        *,
        new_axis: bool = False,
    ) -> Launched:
        """:meth:`run_stacked`, started as :meth:`launch` starts :meth:`run`."""
        return Launched(self.run_stacked(compute, parts, options, new_axis=new_axis))

    def _guarded(self, compute: Compute, step: Callable[..., T], *args: Any) -> T:
        """``step(*args)``, a step of ``compute``'s job, with an allocation failure turned into
        503 ``device_out_of_memory`` after the cached memory is released."""
        try:
            return step(*args)
        except Exception as exc:
            if not self.is_out_of_memory(exc):
                raise
            log.warning("out of %s memory in %s: %s", self.kind, operation_name(compute), exc)
            self.release_memory()
            if self.metrics is not None:
                self.metrics.rejected.labels("device_out_of_memory").inc()
            raise self._out_of_memory(
                f"the {self.kind} ran out of memory for this request (its cached memory was released); "
                "retry later or send a smaller one"
            ) from exc

    def run_stacked(
        self,
        compute: Compute,
        parts: Mapping[str, Sequence[np.ndarray]],
        options: Mapping[str, bool],
        *,
        new_axis: bool = False,
    ) -> dict[str, Any]:
        """Compute one call over each input's ``parts`` joined along the first axis (dynamic batching):
        concatenated, or stacked along a new first axis (``new_axis``: single matrices).

        The joined batch is built once, where the device reads it: here in host memory (one
        ``np.asarray`` over the parts when stacking, a C loop with no view per part); on a GPU
        straight into the pinned staging buffer it is uploaded from, one copy in per input.
        """
        join = np.asarray if new_axis else np.concatenate
        return self.run(compute, {name: join(p) for name, p in parts.items()}, options)

    def _execute(
        self, compute: Compute, tensors: Mapping[str, np.ndarray], options: Mapping[str, bool]
    ) -> dict[str, Any]:
        start = time.perf_counter()
        out = compute(read_only(tensors), options)
        self._observe(compute, {"compute": time.perf_counter() - start})
        return out

    def _observe(self, compute: Compute, stages: Mapping[str, float]) -> None:
        if self.metrics is not None:
            name = operation_name(compute)
            for stage, seconds in stages.items():
                # labels() takes a lock and builds a key per call; the worker resolves each child once.
                child = self._stage_children.get((name, stage))
                if child is None:
                    child = self.metrics.device_seconds.labels(name, stage, self.kind)
                    self._stage_children[(name, stage)] = child
                child.observe(seconds)

    # ------------------------------------------------------------------ reporting

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"kind": self.kind, "name": self.name}
        if self.note:
            info["note"] = self.note
        if self.memory_limit is not None:
            info["memory_limit_bytes"] = self.memory_limit
        return info

    def versions(self) -> dict[str, str | None]:
        return {
            "python": platform.python_version(),
            "lu-service": _version("lu-service"),
            "numpy": np.__version__,
            "scipy": _version("scipy"),
            "numba": _version("numba"),
        }


class Launched:
    """A job started by :meth:`Device.launch`: :meth:`compute`, then :meth:`result` for its answer.
    This one was computed whole by :meth:`Device.run` already."""

    __slots__ = ("_answer",)

    def __init__(self, answer: dict[str, Any]) -> None:
        self._answer = answer

    def compute(self) -> None:
        """Queue the computation (on a GPU; it may wait for the device, e.g. to check for singular systems)."""

    def result(self) -> dict[str, Any]:
        """Wait for the answer (the outputs downloaded)."""
        return self._answer


def _host_lapack() -> str:
    """The host LAPACK's name, chosen now (``LU_CORE_LAPACK``, which may load MKL): a bad value stops the
    service at start-up (exit 2) instead of failing its first request that needs it."""
    from lu_core._cpu import _lapack

    try:
        return _lapack.lapack().name
    except (ValueError, RuntimeError) as exc:
        raise DeviceUnavailableError(str(exc)) from None


class CpuDevice(Device):
    """The CPU: ``lu_core``'s NumPy backend. Large matrices go to the LAPACK that ``LU_CORE_LAPACK``
    picks (``lu_core._cpu._lapack``: MKL on an Intel CPU where its wheel is installed), chosen here, at
    start-up, so that a bad value stops the service (exit 2) instead of failing its first large request."""

    def __init__(self, note: str | None = None, **kwargs: Any) -> None:
        super().__init__(note, **kwargs)
        self.lapack = _host_lapack()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "lapack": self.lapack}


class GpuDevice(Device):
    """One CUDA device, owned by the worker thread.

    A job runs on three streams of the worker's own: inputs go up on ``upload``
    (through reused pinned staging buffers, so the copy is asynchronous), the
    ``compute`` stream waits for them with an event and runs ``lu_core``, and the
    ``download`` stream waits for the compute's event and copies the results out.
    The host waits only for the last event, the one the answer needs; no
    device-wide synchronisation. The events also give the per-stage device time.

    A job runs in three steps (:class:`_GpuJob`): :meth:`launch` queues the upload,
    ``compute()`` the computation, ``result()`` the download, waited for. With a job in
    flight (computed, not collected), the worker queues the next job's upload first, then
    collects the first job's answer, then computes the next: one request's inputs go up
    (host to device) while another's answer comes down (device to host), on the two copy
    engines at once. ``compute()`` may wait for the device (``solve``'s singular-system
    check reads ``info``; pivots a request sent are checked on the device and read back),
    which is why the next upload is queued before, not after, it.
    """

    kind = "gpu"
    overlaps = True
    host_max_n = 0  # LU_GPU_HOST_MAX_N: matrices up to this order are computed on the host

    def overlapped(self, compute: Compute, tensors: Mapping[str, Any]) -> bool:
        return self.overlaps and not host_sized(operation_name(compute), tensors, self.host_max_n)

    def merges(self, name: str, tensors: Mapping[str, np.ndarray]) -> bool:
        # On the host (small matrices) the CPU's rule: always.
        return host_sized(name, tensors, self.host_max_n) or gpu_merges(name, tensors)

    def __init__(
        self,
        index: int,
        *,
        memory_limit: int | None = None,
        pinned_limit: int | None = None,
        host_max_n: int = 0,
        retry_after_s: int = 1,
    ) -> None:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(index)
        total = int(props["totalGlobalMem"])
        super().__init__(
            memory_limit=memory_limit if memory_limit is not None else int(total * DEFAULT_MEMORY_FRACTION),
            retry_after_s=retry_after_s,
        )
        self._cp = cupy
        self.index = index
        raw = props["name"]
        self._name = raw.decode() if isinstance(raw, bytes) else str(raw)
        self._memory = total
        self.pinned_limit = pinned_limit
        self.host_max_n = host_max_n
        if host_max_n:  # host solves (and large host factors) whose path depends on the host LAPACK
            _host_lapack()
        self._pool = cupy.get_default_memory_pool()
        self._pinned_pool = cupy.get_default_pinned_memory_pool()
        with cupy.cuda.Device(index):
            # CuPy raises OutOfMemoryError past this limit instead of taking the whole card.
            self._pool.set_limit(size=self.memory_limit)
        self._streams: tuple[Any, Any, Any] | None = None
        self._staging = PinnedStaging(cupy, pinned_limit)
        runtime = cupy.cuda.runtime
        self._pinner = BodyPinner(
            register=lambda ptr, nbytes: runtime.hostRegister(ptr, nbytes, _HOST_REGISTER_PORTABLE),
            unregister=runtime.hostUnregister,
            reserve=self._staging.reserve,
            unreserve=self._staging.unreserve,
            thread_init=cupy.cuda.Device(index).use,
        )

    def body_pinner(self) -> BodyPinner:
        return self._pinner

    @property
    def name(self) -> str:
        return self._name

    def thread_init(self) -> None:
        cp = self._cp
        cp.cuda.Device(self.index).use()
        self._streams = tuple(cp.cuda.Stream(non_blocking=True) for _ in range(3))  # type: ignore[assignment]

    def memory_in_use(self) -> int:
        # Read from the scraping thread: the pool is per device, so name ours.
        with self._cp.cuda.Device(self.index):
            return int(self._pool.used_bytes())

    def pinned_in_use(self) -> int:
        return self._staging.held_bytes

    def _execute(
        self, compute: Compute, tensors: Mapping[str, np.ndarray], options: Mapping[str, bool]
    ) -> dict[str, Any]:
        job = self.launch(compute, tensors, options)
        job.compute()
        return job.result()

    def launch(self, compute: Compute, tensors: Mapping[str, np.ndarray], options: Mapping[str, bool]) -> Launched:
        if host_sized(operation_name(compute), tensors, self.host_max_n):
            return _HostJob(self, compute, tensors, options)
        return _GpuJob(self, compute, tensors, options)

    def launch_stacked(
        self,
        compute: Compute,
        parts: Mapping[str, Sequence[np.ndarray]],
        options: Mapping[str, bool],
        *,
        new_axis: bool = False,
    ) -> Launched:
        return self.launch(compute, {name: upload_parts(p, new_axis) for name, p in parts.items()}, options)

    def run_stacked(
        self,
        compute: Compute,
        parts: Mapping[str, Sequence[np.ndarray]],
        options: Mapping[str, bool],
        *,
        new_axis: bool = False,
    ) -> dict[str, Any]:
        # Each input's parts are concatenated straight into its pinned staging buffer (or, when
        # small, into one host array) and uploaded in one copy; the outputs come back in one copy each.
        def whole() -> dict[str, Any]:
            job = self.launch_stacked(compute, parts, options, new_axis=new_axis)
            job.compute()
            return job.result()

        return self._guarded(compute, whole)

    def _upload(self, a: Any, stream: Any, staged: list[Any]) -> Any:
        cp = self._cp
        if isinstance(a, cp.ndarray):  # already on the device (a stored factorization's LU and pivots)
            return a
        if not isinstance(a, list) and self._pinner.covers(a):
            # In a page-locked receive buffer (service.pinning): copied from where it arrived, asynchronously.
            # The request's body is held by its job until the job's result is collected, after this copy.
            dev = cp.empty(a.shape, a.dtype)
            dev.set(a, stream=stream)
            return dev
        host = self._staging.stage(a, staged)
        if host is None:  # small, or over the pinned cap: a plain, synchronous copy
            return cp.asarray(np.concatenate(a) if isinstance(a, list) else a)
        dev = cp.empty(host.shape, host.dtype)
        dev.set(host, stream=stream)
        return dev

    def _download(self, v: Any, stream: Any, sources: list[Any]) -> np.ndarray:
        """``v`` copied out on ``stream`` (the caller waits): into a pinned buffer that goes back to the
        staging pool once the answer no longer holds it, or, small or past the pinned cap, into
        pageable memory (a copy a third as fast or slower: 2.4 GB/s for 512 MiB on the first H200)."""
        cp = self._cp
        host = self._staging.lease(v.shape, v.dtype)
        if host is None:
            return cp.asnumpy(v, stream=stream)
        src = cp.ascontiguousarray(v)  # C order, as asnumpy gives (a device copy only where v is a view)
        sources.append(src)
        src.data.copy_to_host_async(ctypes.c_void_p(host.ctypes.data), host.nbytes, stream)
        return host

    def is_out_of_memory(self, exc: BaseException) -> bool:
        cp = self._cp
        if isinstance(exc, ServiceError):
            return False  # already answered (a 503 device_out_of_memory says "out of memory" too)
        if isinstance(exc, MemoryError | cp.cuda.memory.OutOfMemoryError):
            return True
        # cuSOLVER/cuBLAS report a failed workspace allocation as their own status.
        return "ALLOC_FAILED" in str(exc) or "out of memory" in str(exc).lower()

    def release_memory(self) -> None:
        self._pool.free_all_blocks()
        self._staging.clear()
        self._pinned_pool.free_all_blocks()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "index": self.index, "memory_bytes": self._memory}

    @property
    def memory_bytes(self) -> int:
        return self._memory

    def versions(self) -> dict[str, str | None]:
        runtime = self._cp.cuda.runtime.runtimeGetVersion()
        return {
            **super().versions(),
            "cupy": self._cp.__version__,
            "cuda_runtime": f"{runtime // 1000}.{runtime % 1000 // 10}",
        }


class _HostJob(Launched):
    """A small job a GPU service computes on the host (``LU_GPU_HOST_MAX_N``): ``lu_core``'s CPU backend
    in :meth:`compute`, on the worker thread, nothing uploaded or downloaded; timed as the ``host`` stage.
    Like a GPU job's steps, no step turns an allocation failure into a 503 (the worker does)."""

    __slots__ = ("_compute", "_device", "_options", "_tensors")

    def __init__(
        self, device: GpuDevice, compute: Compute, tensors: Mapping[str, Any], options: Mapping[str, bool]
    ) -> None:
        super().__init__({})
        self._device, self._compute, self._options = device, compute, options
        # The parts of a merged call (lists) joined here: one host copy, as the CPU device's run_stacked.
        self._tensors = read_only({k: np.concatenate(v) if isinstance(v, list) else v for k, v in tensors.items()})

    def compute(self) -> None:
        start = time.perf_counter()
        self._answer = self._compute(self._tensors, self._options)
        self._device._observe(self._compute, {"host": time.perf_counter() - start})


class _GpuJob(Launched):
    """One job on the worker's three streams, in three steps the worker may interleave with other jobs'.

    Created: the inputs are staged (pinned buffers) and their upload queued on ``upload``.
    :meth:`compute`: ``compute`` queued on ``work`` after the upload's event (``lu_core`` may wait
    for it there: the singular-system check of ``solve``/``lu_solve`` reads ``info``). :meth:`result`:
    the outputs copied out on ``download`` after the compute's event, waited for; the staging
    buffers go back. Until then the job holds its device arrays, inputs included: CuPy's pool hands
    a freed block to the next allocation on the same stream at once, so an input freed while the
    compute stream still reads it could be overwritten by the next job's upload. Events recorded
    after each wait time each stage on the device alone (not its wait behind another job's).
    """

    __slots__ = ("_compute", "_device", "_marks", "_on_device", "_options", "_out", "_staged")

    def __init__(
        self, device: GpuDevice, compute: Compute, tensors: Mapping[str, np.ndarray], options: Mapping[str, bool]
    ) -> None:
        cp = device._cp
        assert device._streams is not None, "thread_init runs first, on the worker thread"
        upload = device._streams[0]
        self._device, self._compute, self._options = device, compute, options
        self._marks = [cp.cuda.Event() for _ in range(6)]  # upload, compute and download: start, end
        self._staged: list[Any] = []
        self._out: dict[str, Any] | None = None
        try:
            self._marks[0].record(upload)
            with upload:
                self._on_device = {k: device._upload(v, upload, self._staged) for k, v in tensors.items()}
            self._marks[1].record(upload)
        except BaseException:
            self._abandon()
            raise

    def compute(self) -> None:
        _, work, _ = self._device._streams  # type: ignore[misc]
        try:
            work.wait_event(self._marks[1])
            self._marks[2].record(work)
            with work:
                self._out = self._compute(self._on_device, self._options)
            self._marks[3].record(work)
        except BaseException:
            self._abandon()
            raise

    def result(self) -> dict[str, Any]:
        device, cp = self._device, self._device._cp
        _, _, download = device._streams  # type: ignore[misc]
        if self._out is None:
            self._abandon()
            raise RuntimeError("a GPU job's result is collected once, after compute()")
        marks = self._marks
        try:
            download.wait_event(marks[3])
            marks[4].record(download)
            sources: list[Any] = []  # device arrays the queued copies read, kept until they are done
            with download:
                host = {
                    # Resident outputs (a stored factorization) stay on the device.
                    k: v if v is None or isinstance(v, Resident) else device._download(v, download, sources)
                    for k, v in self._out.items()
                }
            marks[5].record(download)
            marks[5].synchronize()  # after it, this job's uploads and compute are done too
            del sources
        except BaseException:
            self._abandon()
            raise
        device._staging.release(self._staged)
        self._out = None
        device._observe(
            self._compute,
            {
                "upload": cp.cuda.get_elapsed_time(marks[0], marks[1]) / 1e3,
                "compute": cp.cuda.get_elapsed_time(marks[2], marks[3]) / 1e3,
                "download": cp.cuda.get_elapsed_time(marks[4], marks[5]) / 1e3,
            },
        )
        return host

    def _abandon(self) -> None:
        """After a failure: wait for whatever the job queued (its kernels may still read its inputs, its
        copies its staging buffers), then give the staging buffers back."""
        for stream in self._device._streams or ():
            stream.synchronize()
        self._device._staging.release(self._staged)
        self._out = None


def upload_parts(parts: Sequence[np.ndarray], new_axis: bool) -> list[np.ndarray]:
    """The parts :meth:`GpuDevice._upload` concatenates into one staging buffer: stacked single
    matrices become ``t[None]`` views (a view each, no copy: the one copy is into the buffer)."""
    return [t[None] for t in parts] if new_axis else list(parts)


class PinnedStaging:
    """Pinned host buffers for uploads and downloads, reused across requests, their total bounded.

    Buffers come from CuPy's pinned memory pool in power-of-two sizes and go back to
    a free list: an upload's after its job (:meth:`release`), a download's (:meth:`lease`)
    when the answer that reads it is gone, so a steady stream of similar requests
    allocates no pinned memory at all. Past ``limit`` bytes held, idle buffers are dropped,
    largest first, until there is room, and handed back to the device driver (CuPy's pinned
    pool would otherwise keep them pinned); if that is not room enough, :meth:`take` answers None and the caller
    copies from or to pageable memory instead (slower, never refused).

    Thread-safe. A leased buffer comes back on whichever thread drops the answer, possibly
    inside a garbage collection that an allocation under ``_lock`` started on the very
    thread that holds it: its finalizer only appends to ``_returned`` (a deque: atomic, no
    lock), which :meth:`take` and :meth:`clear` drain under the lock.
    """

    MIN_BYTES = 1 << 16  # below this a pageable copy costs no more

    def __init__(self, cupy: Any, limit: int | None) -> None:
        self._cp = cupy
        self.limit = limit
        self.held_bytes = 0
        self._free: dict[int, list[Any]] = {}
        self._returned: collections.deque[tuple[int, Any]] = collections.deque()
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> tuple[int, Any] | None:
        """A (size, buffer) of at least ``nbytes``; None when small or over the limit."""
        if nbytes < self.MIN_BYTES:
            return None
        size = 1 << (nbytes - 1).bit_length()
        dropped, room = 0, True
        with self._lock:
            self._drain()
            free = self._free.get(size)
            if free:
                return free.pop()
            if self.limit is not None and self.held_bytes + size > self.limit:
                if self.held_bytes - self._idle_bytes() + size > self.limit:
                    return None  # no room even with every idle buffer dropped (receive buffers pinned)
                dropped = self._drop_idle(self.limit - size)  # other sizes, largest first, until room
                room = self.held_bytes + size <= self.limit
            if room:
                self.held_bytes += size  # counted before the allocation, so that two takers stay under the cap
        try:
            if dropped:
                # Outside the lock (the dropped blocks are still pinned until this returns: the cap may be
                # passed by as much, briefly, by another taker meanwhile).
                self._to_driver()
            return (size, self._cp.cuda.alloc_pinned_memory(size)) if room else None
        except BaseException:
            if room:
                with self._lock:
                    self.held_bytes -= size
            raise

    def lease(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        """An uninitialised C-ordered host array in a pinned buffer, for a download; the buffer goes
        back to the free list when this array and every view of it are gone (the response written).
        None when small or over the limit."""
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        taken = self.take(nbytes)
        if taken is None:
            return None
        raw = np.frombuffer(memoryview(taken[1]), dtype=np.uint8, count=nbytes)
        # raw.base (a memoryview NumPy made, not the one passed) is what raw and every view of it keep
        # alive, and nothing else holds: it dies with the last view of the answer.
        weakref.finalize(raw.base, self._returned.append, taken)
        return raw.view(dtype).reshape(shape)

    def stage(self, a: np.ndarray | list[np.ndarray], staged: list[Any]) -> np.ndarray | None:
        """``a`` (or its parts concatenated along the first axis) copied into a pinned buffer, once.

        The buffer is appended to ``staged`` (give it back with :meth:`release` once the upload
        has completed); None when ``a`` is small or the pinned cap is reached.
        """
        parts = a if isinstance(a, list) else None
        if parts is not None:
            dtype = np.result_type(*parts)
            shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
        else:
            dtype, shape = a.dtype, a.shape
        nbytes = math.prod(shape) * dtype.itemsize
        taken = self.take(nbytes)
        if taken is None:
            return None
        staged.append(taken)
        host = np.frombuffer(taken[1], dtype=np.uint8, count=nbytes).view(dtype).reshape(shape)
        if parts is not None:
            np.concatenate(parts, out=host)
        else:
            np.copyto(host, a)
        return host

    def reserve(self, nbytes: int) -> bool:
        """Count ``nbytes`` of other pinned memory (page-locked receive buffers, :mod:`service.pinning`)
        under the cap; False when they do not fit. Never drops idle staging buffers for them: those
        serve every request, a receive buffer only bodies of its size."""
        with self._lock:
            if self.limit is not None and self.held_bytes + nbytes > self.limit:
                return False
            self.held_bytes += nbytes
            return True

    def unreserve(self, nbytes: int) -> None:
        with self._lock:
            self.held_bytes -= nbytes

    def release(self, taken: list[tuple[int, Any]]) -> None:
        """Back to the free list (after the copies that read them have completed)."""
        with self._lock:
            for item in taken:
                self._free.setdefault(item[0], []).append(item)
        taken.clear()

    def idle(self) -> int:
        """How many buffers wait in the free list (answers already dropped counted)."""
        with self._lock:
            self._drain()
            return sum(map(len, self._free.values()))

    def clear(self) -> None:
        """Drop the idle buffers and hand them back to the driver."""
        with self._lock:
            dropped = self._drop_idle(0)
        if dropped:
            self._to_driver()

    def _idle_bytes(self) -> int:
        """Bytes of the idle buffers (under ``_lock``, after :meth:`_drain`)."""
        return sum(size * len(bufs) for size, bufs in self._free.items())

    def _drain(self) -> None:
        """Leased buffers whose answers are gone back to the free list (under ``_lock``)."""
        while self._returned:
            item = self._returned.popleft()
            self._free.setdefault(item[0], []).append(item)

    def _drop_idle(self, target: int) -> int:
        """Drop idle buffers, largest first, until at most ``target`` bytes are held (or none is idle);
        the bytes dropped (under ``_lock``; the caller hands them back to the driver after, outside it:
        ``cudaFreeHost`` may wait for the device, and the body pool waits on this lock)."""
        self._drain()
        dropped = 0
        for size in sorted(self._free, reverse=True):
            bufs = self._free[size]
            while bufs and self.held_bytes - dropped > target:
                dropped += bufs.pop()[0]
            if not bufs:
                del self._free[size]
        self.held_bytes -= dropped
        return dropped

    def _to_driver(self) -> None:
        pool = getattr(self._cp, "get_default_pinned_memory_pool", None)
        if pool is not None:
            pool().free_all_blocks()  # CuPy's pool keeps freed pinned blocks until told


def gpu_problem(index: int) -> str | None:
    """None when GPU ``index`` is usable, else why not."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (install the cuda12 or cuda13 extra)"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no device: CuPy raises its CUDARuntimeError
        return f"CUDA reports no usable device ({exc})"
    if index >= count:
        return f"LU_GPU_ID={index} but CUDA sees {count} device(s)"
    return None


def select_device(settings: Settings) -> Device:
    """The device the settings ask for; raises :class:`DeviceUnavailableError` for gpu without one."""
    if settings.device == "cpu":
        cpu = CpuDevice(retry_after_s=settings.retry_after_s)
        log.info("computing on the CPU (LU_DEVICE=cpu; LAPACK: %s)", cpu.lapack)
        return cpu
    problem = gpu_problem(settings.gpu_id)
    if problem is None:
        device = GpuDevice(
            settings.gpu_id,
            memory_limit=settings.gpu_memory_bytes,
            pinned_limit=settings.gpu_pinned_bytes,
            host_max_n=settings.gpu_host_max_n,
            retry_after_s=settings.retry_after_s,
        )
        log.info(
            "computing on GPU %d: %s; device pool limit %d bytes", settings.gpu_id, device.name, device.memory_limit
        )
        return device
    if settings.device == "gpu":
        raise DeviceUnavailableError(f"LU_DEVICE=gpu but no GPU is usable: {problem}")
    note = f"no GPU: {problem}; computing on the CPU"
    cpu = CpuDevice(note=note, retry_after_s=settings.retry_after_s)
    log.warning("LU_DEVICE=auto: %s (LAPACK: %s)", note, cpu.lapack)
    return cpu
