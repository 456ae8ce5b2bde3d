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


_LATE = """
import ctypes, sys, warnings
for lib in sys.argv[1:]:
    ctypes.CDLL(lib)  # a GNU OpenMP runtime loaded first, as `import torch` does
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import lu_core
print([str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)])
"""


def _libgomp() -> str:
    import ctypes.util

    name = ctypes.util.find_library("gomp")
    if name is None:
        pytest.skip("no GNU OpenMP runtime on this machine")
    return name


def _late(env: dict[str, str], *libs: str) -> str:
    out = subprocess.run([sys.executable, "-c", _LATE, *libs], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("preset", [None, "OMP_WAIT_POLICY", "both"])
def test_a_runtime_started_before_lu_core_is_reported_with_the_settings_it_missed(preset: str | None) -> None:
    """libgomp reads its settings when it loads: one loaded before ``import lu_core`` (by torch) never
    sees lu_core's, and its spinning threads slow the CPU path, so lu_core says so, naming what is
    missing; nothing is said where the user set them all."""
    env = _without_settings()
    if preset == "both":
        env.update(SETTINGS)
    elif preset is not None:
        env[preset] = "PASSIVE"
    said = _late(env, _libgomp())
    if preset == "both":
        assert said == "[]"
        return
    assert "started before lu_core was imported" in said and "Import lu_core first" in said
    assert ("OMP_WAIT_POLICY=PASSIVE" in said) == (preset is None)
    assert "GOMP_SPINCOUNT=0" in said


def test_nothing_is_said_where_no_runtime_started_first() -> None:
    assert _late(_without_settings()) == "[]"


def test_the_runtime_is_found_by_its_mapped_file(tmp_path) -> None:
    from lu_core import _threads

    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libm.so.6\n7f02-7f03 rw-p 00000000 00:00 0 \n")
    assert _threads.started_openmp(str(maps)) is None
    assert _threads.started_openmp(str(tmp_path / "absent")) is None  # no /proc: nothing to tell
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1   /opt/torch lib/libgomp-a34b3233.so.1 (deleted)\n")
    assert _threads.started_openmp(str(maps)) == "/opt/torch lib/libgomp-a34b3233.so.1 (deleted)"
