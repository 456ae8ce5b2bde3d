"""Which device computes, and how arrays reach it and come back.

``LU_DEVICE=auto`` takes the GPU when CuPy is installed and sees one, and
otherwise the CPU, saying why in the log and in ``/readyz``. ``LU_DEVICE=gpu``
refuses to start without a GPU. The worker thread calls :meth:`Device.run`:
on the GPU that copies NumPy inputs in once on the worker's own CUDA stream,
computes with CuPy arrays (``lu_core`` dispatches on them) and copies the
results out once. Outputs wrapped in :class:`Resident` stay where they were
computed (the factorization store keeps them on the device).
"""

from __future__ import annotations

import importlib.metadata
import logging
import platform
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from service.config import Settings

__all__ = ["CpuDevice", "Device", "DeviceUnavailableError", "GpuDevice", "Resident", "select_device"]

log = logging.getLogger("service.device")

Compute = Callable[[Mapping[str, Any], Mapping[str, bool]], dict[str, Any]]


class DeviceUnavailableError(RuntimeError):
    """``LU_DEVICE=gpu`` was asked for and no GPU is usable."""


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


class Device:
    kind = "cpu"

    def __init__(self, note: str | None = None) -> None:
        self.note = note  # why auto chose the CPU, if it did

    @property
    def name(self) -> str:
        return platform.processor() or platform.machine()

    def thread_init(self) -> None:
        """Called once on the worker thread before its first job."""

    def run(self, compute: Compute, tensors: Mapping[str, np.ndarray], options: Mapping[str, bool]) -> dict[str, Any]:
        return compute(tensors, options)

    def is_out_of_memory(self, exc: BaseException) -> bool:
        return isinstance(exc, MemoryError)

    def release_memory(self) -> None:
        """Give cached memory back after an out-of-memory error."""

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"kind": self.kind, "name": self.name}
        if self.note:
            info["note"] = self.note
        return info

    def versions(self) -> dict[str, str | None]:
        return {
            "python": platform.python_version(),
            "lu-service": _version("lu-service"),
            "numpy": np.__version__,
            "scipy": _version("scipy"),
            "numba": _version("numba"),
        }


class CpuDevice(Device):
    pass


class GpuDevice(Device):
    kind = "gpu"

    def __init__(self, index: int) -> None:
        super().__init__()
        import cupy

        self._cp = cupy
        self.index = index
        props = cupy.cuda.runtime.getDeviceProperties(index)
        raw = props["name"]
        self._name = raw.decode() if isinstance(raw, bytes) else str(raw)
        self._memory = int(props["totalGlobalMem"])
        self._stream: Any = None

    @property
    def name(self) -> str:
        return self._name

    def thread_init(self) -> None:
        self._cp.cuda.Device(self.index).use()
        self._stream = self._cp.cuda.Stream(non_blocking=True)

    def run(self, compute: Compute, tensors: Mapping[str, np.ndarray], options: Mapping[str, bool]) -> dict[str, Any]:
        cp = self._cp
        with self._stream:
            on_device = {k: cp.asarray(v) for k, v in tensors.items()}
            out = compute(on_device, options)
            host = {
                k: v if v is None or isinstance(v, Resident) else cp.asnumpy(v, stream=self._stream)
                for k, v in out.items()
            }
            self._stream.synchronize()
        return host

    def is_out_of_memory(self, exc: BaseException) -> bool:
        cp = self._cp
        if isinstance(exc, MemoryError | cp.cuda.memory.OutOfMemoryError):
            return True
        # cuSOLVER/cuBLAS report a failed workspace allocation as their own status.
        return "ALLOC_FAILED" in str(exc) or "out of memory" in str(exc).lower()

    def release_memory(self) -> None:
        self._cp.get_default_memory_pool().free_all_blocks()
        self._cp.get_default_pinned_memory_pool().free_all_blocks()

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


def _gpu_problem(index: int) -> str | None:
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
        log.info("computing on the CPU (LU_DEVICE=cpu)")
        return CpuDevice()
    problem = _gpu_problem(settings.gpu_id)
    if problem is None:
        device = GpuDevice(settings.gpu_id)
        log.info("computing on GPU %d: %s", settings.gpu_id, device.name)
        return device
    if settings.device == "gpu":
        raise DeviceUnavailableError(f"LU_DEVICE=gpu but no GPU is usable: {problem}")
    note = f"no GPU: {problem}; computing on the CPU"
    log.warning("LU_DEVICE=auto: %s", note)
    return CpuDevice(note=note)
