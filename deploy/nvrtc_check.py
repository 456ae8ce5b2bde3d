"""Compile every ``lu_core/_gpu/*.cu`` through NVRTC as the backend does, without a GPU.

Used by ``deploy/image_check.py`` inside the gpu image until the GPU core's own NVRTC
test (``tests/lu_core/_gpu/test_nvrtc*.py``) exists; that test is run instead when it does.
Same source, options and ``name_expressions`` as ``lu_core._gpu.backend`` passes to
``cupy.RawModule``, with CuPy's own include folder, for sm_80 and sm_90; only the
device query is replaced by a named architecture (there is no device to ask).
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    import cupy
    from cupy.cuda import compiler

    from lu_core._gpu import backend

    include = Path(cupy.__file__).parent / "_core" / "include"
    # backend._module: RawModule(code="#include <cupy/complex.cuh>\n" + source, options=("-std=c++14",), ...)
    options = tuple(getattr(backend, "_OPTIONS", ("-std=c++14",)))
    # The include folders CuPy gives NVRTC: its own headers, the CCCL it bundles, the CUDA runtime's.
    cccl = include / "cupy" / "_cccl"
    runtime = Path(cupy.__file__).parents[1] / "nvidia" / "cuda_runtime" / "include"
    folders = [include, cccl / "libcudacxx", cccl / "cub", cccl / "thrust", runtime]
    options = (*options, *(f"-I{f}" for f in folders if f.is_dir()))
    sources = sorted(Path(backend.__file__).parent.glob("*.cu"))
    names = backend._name_expressions()
    # The architecture query asks the device (memoised per device); name the architecture instead.
    compiler._get_arch_for_options_for_nvrtc = lambda arch=None: (f"-arch=sm_{arch}", "cubin")
    failures = []
    for source in sources:
        for arch in ("80", "90"):
            try:
                compiler.compile_using_nvrtc(
                    "#include <cupy/complex.cuh>\n" + source.read_text(), options, arch, source.name, names, None, True
                )  # source, options, arch, filename, name_expressions, log_stream, cache_in_memory
            except Exception as exc:
                failures.append(f"{source.name} sm_{arch}: {type(exc).__name__}: {str(exc)[:2000]}")
    for f in failures:
        print(f, file=sys.stderr)
    if failures:
        return 1
    print(f"{len(sources)} source(s), {len(names)} instantiations, sm_80 and sm_90: compiled with options {options}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
