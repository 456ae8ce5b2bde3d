"""The GPU backend's own kernels, compiled for the host and run under simt.h's emulation of CUDA.

A check of the kernels' logic where no GPU is lent: the very ``.cu`` files of
``lu_core/_gpu`` and their ``common.cuh`` (read through ``_sources``, with their name
expressions), after the backend's own prelude (CuPy's ``<cupy/complex.cuh>``, from the
headers CuPy gives NVRTC), compiled by the host's C++ compiler against ``simt.h`` and
run with launches built by the backend's own
``lu_core._gpu._launch`` (shapes and argument types). The only edit to a source is the
form of its ``extern __shared__`` declarations, which become pointers to the block's
dynamic shared memory (:func:`host_source`; the line numbers stay the source's).

Two builds: AddressSanitizer + UndefinedBehaviorSanitizer (``"address"``: out-of-bounds
accesses, shared memory included, signed overflow) and ThreadSanitizer (``"thread"``:
threads of a block touching the same memory without a barrier between them). Both are
compiled once per test session.

What this cannot see: the device's compiler (NVRTC compiles these sources in
``test_cuda_sources.py``), its floating-point contraction (``--fmad=false`` for
``small_lu.cu``), Thrust's complex arithmetic, timing, and everything outside these
kernels (cuBLAS, cuSOLVER, CuPy).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
from typing import NamedTuple

import numpy as np

from lu_core._gpu import _launch, _sources

HERE = pathlib.Path(__file__).parent

_SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([A-Za-z_][\w ]*?)\s+(\w+)\s*\[\s*\]\s*;")

# Frame pointers, no inlining and no optimisation (which may duplicate a call into two branches):
# simt.h tells shuffle sites apart by return addresses.
COMMON_FLAGS = ("-std=c++20", "-O0", "-g", "-fno-omit-frame-pointer", "-fno-inline")
FLAGS = {
    "address": ("-fsanitize=address,undefined", "-fno-sanitize-recover=all"),
    "thread": ("-fsanitize=thread",),
}


def compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++"))


def host_source(source: str) -> str:
    """``source``'s text for the host: each ``extern __shared__ T name[];`` becomes a pointer to the
    block's dynamic shared memory. Raises if the source has a declaration the pattern misses."""
    text = (_sources._HERE / source).read_text()
    rewritten, count = _SHARED.subn(r"\1* \2 = simt::dynamic_shared<\1>();", text)
    if rewritten.count("__shared__") != 0 or text.count("extern __shared__") != count:
        raise AssertionError(f"{source}: a __shared__ declaration the host build does not know how to emulate")
    return rewritten


def cupy_headers() -> list[str]:
    """The include directories CuPy gives NVRTC that hold its own headers (its ``complex.cuh`` and the
    CCCL it bundles), as system headers (their warnings are not ours). Needs CuPy (not a GPU)."""
    import cupy
    from cupy._core.core import assemble_cupy_compiler_options

    root = str(pathlib.Path(cupy.__file__).parent)
    dirs = [o[2:] for o in assemble_cupy_compiler_options(()) if o.startswith("-I") and o[2:].startswith(root)]
    return [arg for d in dirs for arg in ("-isystem", d)]


def _namespace(source: str) -> str:
    return "src_" + re.sub(r"\W", "_", source.removesuffix(".cu"))


def translation_unit(sources: tuple[str, ...] | None = None) -> str:
    """One C++ file: every source (or those of ``sources``) in its own namespace, then the table of its
    name expressions."""
    chosen = sorted(_sources.SOURCES if sources is None else sources)
    parts = ['#include "simt.h"', _sources.PRELUDE]
    common = (_sources._HERE / _sources.COMMON).resolve()
    for source in chosen:
        path = (_sources._HERE / source).resolve()
        parts += [f"namespace {_namespace(source)} {{", f'#line 1 "{common}"', host_source(_sources.COMMON)]
        parts += [f'#line 1 "{path}"', host_source(source), "}", ""]
    parts += ['#include "runner.h"', "", "const simt::Entry simt_entries[] = {"]
    count = 0
    for source in chosen:
        for name in _sources.SOURCES[source][1]:
            fn = f"&{_namespace(source)}::{name}"
            parts.append(f'    {{"{source}", "{name}", simt::entry({fn}).first, simt::entry({fn}).second}},')
            count += 1
    parts += ["};", f"const std::size_t simt_entry_count = {count};", ""]
    return "\n".join(parts)


def build(sanitizer: str, directory: pathlib.Path, sources: tuple[str, ...] | None = None) -> pathlib.Path:
    """The runner built with ``sanitizer`` in ``directory`` (reused while the sources are the same), with
    every source's kernels or only those of ``sources`` (a build of small_lu.cu alone takes half the time)."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++, or $CXX)")
    code = translation_unit(sources)
    command = [
        cxx,
        *COMMON_FLAGS,
        "-Wall",
        "-Werror",
        "-Wno-unknown-pragmas",
        *FLAGS[sanitizer],
        "-I",
        str(HERE),
        *cupy_headers(),
    ]
    key = hashlib.sha256(
        "\0".join([code, (HERE / "simt.h").read_text(), (HERE / "runner.h").read_text(), *command]).encode()
    ).hexdigest()[:16]
    exe = directory / f"runner-{sanitizer}-{key}"
    if not exe.exists():
        unit = directory / f"unit-{key}.cpp"
        unit.write_text(code)
        done = subprocess.run([*command, str(unit), "-o", str(exe)], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"the host build of the kernels failed:\n{done.stderr[-6000:]}")
    return exe


class At(NamedTuple):
    """A launch argument: a pointer to item ``first`` of ``array`` (C-contiguous), as CuPy passes a view
    that starts inside its allocation; the kernel may read before it, within ``array``."""

    array: np.ndarray
    first: int


class KernelFailed(RuntimeError):
    """The emulated launch stopped: a sanitizer report, a deadlock, a divergent barrier or shuffle."""


def run(exe: pathlib.Path, launch: _launch.Launch, timeout: float = 300) -> None:
    """Run ``launch`` (built by ``lu_core._gpu._launch``; its grid, block and shared memory may be
    replaced with ``launch._replace``) as CuPy would: arrays (C-contiguous, updated in place from the
    kernel's writes; a read-only one must come back unchanged) become pointers, NumPy integer scalars
    integers of their width."""
    (grid,), (block,), shared = launch.grid, launch.block, launch.shared
    with tempfile.TemporaryDirectory(prefix="simt-") as tmp:
        lines = [f"kernel {launch.source} {launch.name}", f"launch {grid} {block} {shared}"]
        buffers = []
        for i, arg in enumerate(launch.args):
            a, first = (arg.array, arg.first) if isinstance(arg, At) else (arg, 0)
            if isinstance(a, np.ndarray):
                if not a.flags.c_contiguous:
                    raise ValueError(f"argument {i}: the kernels take C-contiguous arrays")
                path = pathlib.Path(tmp) / f"{i}.bin"
                path.write_bytes(a.tobytes())
                lines.append(f"buf {path} {a.nbytes} {a.dtype.kind} {a.dtype.itemsize} {first}")
                buffers.append((a, path))
            elif isinstance(a, np.integer):
                lines.append(f"int {a.dtype.itemsize} {int(a.dtype.kind == 'i')} {int(a)}")
            else:
                raise TypeError(f"argument {i}: {type(a).__name__} (CuPy takes arrays and NumPy scalars)")
        spec = pathlib.Path(tmp) / "spec"
        spec.write_text("\n".join(lines) + "\n")
        env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0", "TSAN_OPTIONS": "halt_on_error=1"}
        done = subprocess.run([str(exe), str(spec)], capture_output=True, text=True, timeout=timeout, env=env)
        if done.returncode:
            raise KernelFailed(
                f"{launch.source} {launch.name} {launch.grid} {launch.block} {launch.shared}: "
                f"exit {done.returncode}\n{done.stderr[-8000:]}"
            )
        for a, path in buffers:
            after = np.frombuffer(path.read_bytes(), dtype=a.dtype).reshape(a.shape)
            if a.flags.writeable:
                a[...] = after
            elif after.tobytes() != a.tobytes():
                raise KernelFailed(f"{launch.source} {launch.name}: wrote into a read-only argument")
