"""Root conftest: doctest collection over ``lu_core`` must not import the GPU
backend where it cannot be imported: it needs CuPy and CuPy's cuBLAS / cuSOLVER
libraries (CI installs the CuPy wheel for the NVRTC compile test, without them)."""

from __future__ import annotations


def _gpu_backend_importable() -> bool:
    try:
        from cupy_backends.cuda.libs import cublas, cusolver  # noqa: F401 - loading them is the check
    except Exception:  # CuPy missing (ImportError), or its libraries missing (also ImportError, or OSError)
        return False
    return True


collect_ignore_glob = [] if _gpu_backend_importable() else ["lu_core/_gpu/*.py"]
