from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings

settings.register_profile("default", deadline=None, max_examples=60)
settings.load_profile("default")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261122)


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
