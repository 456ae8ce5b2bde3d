"""lu_core's OpenMP settings reach the environment on import, before NumPy and SciPy load."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SETTINGS = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}
# The environment NumPy and SciPy see when they are first imported (Numba loads later, at a kernel's first call).
_PROBE = """
import json, os, sys
names = sys.argv[1:]
seen = {}

class Watch:
    def find_spec(self, fullname, path=None, target=None):
        if fullname in ("numpy", "scipy.linalg") and fullname not in seen:
            seen[fullname] = {k: os.environ.get(k) for k in names}
        return None

sys.meta_path.insert(0, Watch())
import lu_core
import scipy.linalg  # what the CPU backend's LAPACK calls load, if lu_core's import has not
print(json.dumps({"env": {k: os.environ.get(k) for k in names}, "seen": seen}))
"""


def _probe(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, *SETTINGS], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _without_settings() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in SETTINGS}


def test_defaults_are_set_before_numpy_and_scipy_load() -> None:
    got = _probe(_without_settings())
    assert got["env"] == SETTINGS
    assert sorted(got["seen"]) == ["numpy", "scipy.linalg"]
    for runtime, seen in got["seen"].items():
        assert seen == SETTINGS, runtime


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_a_value_the_user_set_wins(name: str) -> None:
    assert _probe({**_without_settings(), name: "7"})["env"][name] == "7"
