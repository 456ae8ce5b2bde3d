"""Root conftest: doctest collection over ``lu_core`` must not import the GPU
backend where CuPy is not installed (it imports CuPy at module level)."""

from __future__ import annotations

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("cupy") else ["lu_core/_gpu/*.py"]
