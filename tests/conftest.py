from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings

settings.register_profile("default", deadline=None, max_examples=60)
settings.load_profile("default")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261122)


@pytest.fixture(params=["mkl", "scipy"])
def lapack(request, monkeypatch) -> str:
    """Each LAPACK the CPU backend may run on, as the process's choice for the test (MKL skipped where its
    wheel is not installed), whatever ``LU_CORE_LAPACK=auto`` took on this CPU."""
    from lu_core._cpu import _lapack, _mkl

    if request.param == "mkl" and _mkl.library_path() is None:
        pytest.skip("the mkl wheel is not installed (pip install 'lu-service[mkl]')")
    monkeypatch.setattr(_lapack, "_chosen", _lapack.choose(request.param))
    return request.param


def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device visible (CuPy missing or no GPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
