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
import ctypes, os, sys, warnings
for lib in sys.argv[1:]:
    ctypes.CDLL(lib)  # a GNU OpenMP runtime loaded first, as `import torch` does
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import lu_core
print(os.environ.get("GOMP_SPINCOUNT"))
print([str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)])
"""


def _libgomp() -> str:
    import ctypes.util

    name = ctypes.util.find_library("gomp")
    if name is None:
        pytest.skip("no GNU OpenMP runtime on this machine")
    return name


def _late(env: dict[str, str], *libs: str) -> tuple[str, str]:
    out = subprocess.run([sys.executable, "-c", _LATE, *libs], env=env, capture_output=True, text=True, check=True)
    spincount, said = out.stdout.strip().splitlines()[-2:]
    return spincount, said


def test_a_runtime_started_before_lu_core_is_reported() -> None:
    """libgomp reads its settings when it loads: one loaded before ``import lu_core`` (by torch) never
    sees lu_core's wait policy, and its spinning threads slow the CPU path, so lu_core says so."""
    spincount, said = _late(_without_settings(), _libgomp())
    assert "started before lu_core was imported" in said and "OMP_WAIT_POLICY=PASSIVE cannot reach it" in said
    assert "Import lu_core first, or set OMP_WAIT_POLICY=PASSIVE in the environment" in said
    assert spincount == "0"  # still set, for runtimes that start later


@pytest.mark.parametrize("policy", ["PASSIVE", "passive", "ACTIVE"])
def test_a_policy_the_user_set_is_kept_and_nothing_is_said(policy: str) -> None:
    """The user's policy reached the runtime when it loaded; GOMP_SPINCOUNT=0 joins a passive one only (an
    ACTIVE policy asks for spinning, which a zero spin count would undo)."""
    spincount, said = _late({**_without_settings(), "OMP_WAIT_POLICY": policy}, _libgomp())
    assert said == "[]"
    assert spincount == ("None" if policy == "ACTIVE" else "0")


def test_nothing_is_said_where_no_runtime_started_first() -> None:
    assert _late(_without_settings()) == ("0", "[]")


def test_the_runtime_is_found_by_its_mapped_file(tmp_path) -> None:
    from lu_core import _threads

    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libm.so.6\n7f02-7f03 rw-p 00000000 00:00 0 \n")
    assert _threads.started_openmp(str(maps)) is None
    assert _threads.started_openmp(str(tmp_path / "absent")) is None  # no /proc: nothing to tell
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1   /opt/torch lib/libgomp-a34b3233.so.1 (deleted)\n")
    assert _threads.started_openmp(str(maps)) == "/opt/torch lib/libgomp-a34b3233.so.1 (deleted)"
