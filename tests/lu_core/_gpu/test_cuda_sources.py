"""Every .cu source compiles ahead of time for sm_80 and sm_90 (runs wherever
nvcc is on PATH, GPU or not), with every template instantiated for every dtype,
so a kernel that does not compile fails CI without a GPU."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

SOURCES = sorted((pathlib.Path(__file__).parents[3] / "lu_core" / "_gpu").glob("*.cu"))
NVCC = shutil.which("nvcc")

WRAPPER = """#include <thrust/complex.h>
#define LU_CORE_COMPLEX thrust::complex
#define LU_CORE_NVCC_CHECK
#include "{source}"
"""


def test_sources_exist():
    assert SOURCES, "no CUDA sources found under lu_core/_gpu"


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_compiles(tmp_path, source, arch):
    wrapper = tmp_path / "check.cu"
    wrapper.write_text(WRAPPER.format(source=source.as_posix()))
    result = subprocess.run(
        [
            NVCC,
            "-std=c++17",
            f"-arch={arch}",
            "-Werror",
            "all-warnings",
            "-c",
            str(wrapper),
            "-o",
            str(tmp_path / "k.o"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
