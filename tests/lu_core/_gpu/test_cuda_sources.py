"""Every CUDA source compiles the way the backend compiles it at run time.

NVRTC through CuPy's own compile path (``cupy._core.core.compile_with_cache``,
which ``RawModule.compile()`` reaches through its per-device memo), CuPy's
bundled headers, and the very ``code``, ``options`` and ``name_expressions`` of
the ``RawModule`` objects the backend builds (``_sources.raw_module``). No GPU
and no CUDA driver are needed (``make test`` installs the ``cupy-cuda13x`` wheel
and ``nvidia-cuda-nvrtc``); two things are replaced, and only these:

* the device queries for the target architecture (``_get_arch``,
  ``_get_arch_for_options_for_nvrtc``), which answer sm_80 / sm_90 here;
* the last step, loading the cubin into a device context, which needs a
  driver: the NVRTC call is wrapped to keep its output and stop there.
  CuPy's kernel disk cache is bypassed so that NVRTC really runs.

Not a GPU test: it runs in CI, where a kernel that NVRTC rejects fails.
"""

from __future__ import annotations

import pytest

cp = pytest.importorskip("cupy", reason="make test installs cupy-cuda13x; without it nothing here can run")
compiler = pytest.importorskip("cupy.cuda.compiler")
core = pytest.importorskip("cupy._core.core")

from lu_core._gpu import _sources  # noqa: E402 - needs CuPy, checked above

ARCHS = ["80", "90"]


class _Compiled(Exception):
    """Raised with NVRTC's output where CuPy would next load it onto a device."""


class _NoDiskCache:
    def load(self, name: str) -> None:
        return None

    def save(self, name: str, payload: bytes, source: str) -> None:
        pass


@pytest.fixture
def nvrtc(monkeypatch, tmp_path):
    """Compile like ``RawModule.compile()`` for a given architecture; return (cubin, mangled names)."""
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiler, "_kernel_cache_backend", _NoDiskCache())
    real = compiler._compile_using_nvrtc_no_warning

    def stop_before_loading(*args, **kwargs):
        raise _Compiled(real(*args, **kwargs))

    monkeypatch.setattr(compiler, "_compile_using_nvrtc_no_warning", stop_before_loading)

    def compile_module(module: cp.RawModule, arch: str) -> tuple[bytes, dict[str, str]]:
        monkeypatch.setattr(compiler, "_get_arch", lambda: arch)
        monkeypatch.setattr(compiler, "_get_arch_for_options_for_nvrtc", lambda a=None: (f"-arch=sm_{arch}", "cubin"))
        # The call cupy/_core/raw.pyx's _get_raw_module makes for a RawModule built from code.
        # translate_cucomplex and jitify are not readable from Python; the backend leaves both
        # at RawModule's default, False.
        with pytest.raises(_Compiled) as done:
            core.compile_with_cache(
                module.code,
                module.options,
                prepend_cupy_headers=False,
                backend=module.backend,
                translate_cucomplex=False,
                enable_cooperative_groups=module.enable_cooperative_groups,
                name_expressions=module.name_expressions,
                log_stream=None,
                jitify=False,
            )
        return done.value.args[0]

    return compile_module


def test_every_source_is_listed():
    on_disk = sorted(p.name for p in _sources._HERE.glob("*.cu"))
    assert on_disk == sorted(_sources.SOURCES), "a .cu file the backend never compiles, or a missing one"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", sorted(_sources.SOURCES))
def test_compiles_with_nvrtc(nvrtc, source, arch):
    module = _sources.raw_module(source)
    options, names = _sources.SOURCES[source]
    assert module.options == options and module.options[: len(_sources.OPTIONS)] == _sources.OPTIONS
    cubin, mangled = nvrtc(module, arch)
    assert isinstance(cubin, bytes) and cubin[:4] == b"\x7fELF", "NVRTC did not produce a cubin"
    assert set(mangled) == set(names), "an instantiation the backend launches is missing"


def test_old_options_fail(nvrtc):
    """The check can fail: the options used before CuPy 14 (C++14) stop at Thrust's #error."""
    module = _sources.raw_module("kernels.cu")
    old = cp.RawModule(code=module.code, options=("-std=c++14",), name_expressions=module.name_expressions)
    with pytest.raises(compiler.CompileException, match="requires at least C\\+\\+17"):
        nvrtc(old, "90")


def test_a_broken_kernel_fails(nvrtc):
    module = _sources.raw_module("small_lu.cu")
    broken = cp.RawModule(
        code=module.code.replace("return fabs(x.real()) + fabs(x.imag());", "return fabs(x);"),
        options=module.options,
        name_expressions=module.name_expressions,
    )
    with pytest.raises(compiler.CompileException):
        nvrtc(broken, "90")
