# syntax=docker/dockerfile:1
# The LU service, for GPU hosts (target gpu, the default) and CPU-only hosts (target cpu).
#
#   make image TARGET=gpu                                         # docker, or buildah where no engine runs
#   docker build -t lu-service:gpu .                              # CUDA 12 wheels
#   docker build -t lu-service:gpu-cu13 --build-arg CUDA=13 .     # CUDA 13 wheels
#   docker build -t lu-service:cpu --target cpu .                 # no CuPy at all
#
# Base: python slim plus CuPy's own CUDA wheels (cupy-cudaXXx[ctk] pulls cuBLAS,
# cuSOLVER, NVRTC and the runtime from PyPI), not an nvidia/cuda image: the CUDA
# runtime images carry the whole toolkit's runtime set (cuFFT, cuSPARSE, NPP, ...)
# on top of Ubuntu, while the service needs a few libraries. The driver comes from
# the host through the NVIDIA Container Toolkit either way.
#
# Layer order: the dependencies (deploy/constraints.txt) are installed before any
# code is copied, and the code lives in its own small folder (/opt/app), so a code
# change rebuilds a few MB instead of re-downloading the CUDA wheels.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---------------------------------------------------------------- dependencies: a virtual environment
FROM ${PYTHON_IMAGE} AS deps
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY deploy/constraints.txt /tmp/constraints.txt
# The pins are a freeze of '.[server]': install exactly them (CuPy comes in deps-gpu).
RUN sed '/^cupy-/d' /tmp/constraints.txt > /tmp/requirements.txt \
    && pip install --no-deps --requirement /tmp/requirements.txt

# Intel MKL for the cpu target's large matrices on Intel hosts (lu_core/_cpu/_mkl.py; LU_CORE_LAPACK=auto keeps
# OpenBLAS on other vendors' CPUs, where MKL measured slower, but for its threaded getrf of float64 and complex
# matrices of n 384 to 1024; the gpu target's CPU fallback keeps SciPy's OpenBLAS). Without its intel-openmp
# and tbb dependencies: MKL runs on the GNU OpenMP layer, Numba's (libgomp1, installed in the runtime stage).
# Without the libraries lu_core never loads (ScaLAPACK, BLACS, cluster FFT, vector math, the 64-bit-integer
# interface, Intel's and TBB's threading layers: MKL_THREADING_LAYER=INTEL or TBB would fail in this image):
# 650 -> 470 MB.
FROM deps AS deps-cpu
ARG MKL_VERSION=2026.2.0
RUN pip install --no-deps "mkl==${MKL_VERSION}" \
    && rm -f /opt/venv/lib/libmkl_scalapack_* /opt/venv/lib/libmkl_blacs_* /opt/venv/lib/libmkl_cdft_* \
             /opt/venv/lib/libmkl_vml_* /opt/venv/lib/libmkl_*ilp64* \
             /opt/venv/lib/libmkl_intel_thread.* /opt/venv/lib/libmkl_tbb_thread.* \
    && rm -rf /opt/venv/share/doc/mkl

FROM deps AS deps-gpu
ARG CUDA=12
ARG CUPY_VERSION=14.2.0
# cuFFT and cuRAND come with the [ctk] extra but the service never loads them
# (CuPy imports them lazily, for cupy.fft and cupy.random only): about 300 MB less.
RUN pip install --constraint /tmp/constraints.txt "cupy-cuda${CUDA}x[ctk]==${CUPY_VERSION}" \
    && site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    && rm -rf "$site"/nvidia/cufft "$site"/nvidia/curand "$site"/nvidia/*/lib/*.a
# nvmath-python wraps cuSOLVER's IRS solver (cusolverDnIRSXgesv), which solve_refined uses on
# the GPU. Without its cu12/cu13 extra: cuSOLVER and cuBLAS are already here from CuPy's [ctk]
# wheels, and the extra would add cuTENSOR and cuDSS, which the service never loads. Its own
# layer after CuPy's, so that changing it never re-downloads the CUDA wheels.
ARG NVMATH_VERSION=1.0.0
RUN pip install --constraint /tmp/constraints.txt "nvmath-python==${NVMATH_VERSION}"

# ---------------------------------------------------------------- the project's code, alone
FROM ${PYTHON_IMAGE} AS code
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY lu_core lu_core
COPY service service
# --target: the package (lu_core, service, its metadata and the lu-service script)
# in a folder of its own, laid over the dependencies' environment at run time.
RUN python -m venv /tmp/b && /tmp/b/bin/pip install --no-deps --target /opt/app . \
    && sed -i '1s|.*|#!/opt/venv/bin/python|' /opt/app/bin/lu-service \
    && python -m compileall -q /opt/app

# ---------------------------------------------------------------- Numba's compiled CPU kernels
# Compiled here, in the small environment, and copied into both targets: a container is
# ready in seconds, and no step ever runs inside the (large) final images. The code sits
# at the same path with the same timestamps as in the targets, so the cache is valid there.
FROM deps AS kernels
COPY --from=code /opt/app /opt/app
ENV PYTHONPATH=/opt/app NUMBA_CACHE_DIR=/numba-cache
RUN python -c "from service.app import warm_up; from service.device import CpuDevice; warm_up(CpuDevice())"

# ---------------------------------------------------------------- runtime: no compilers, non-root
# Everything that only sets metadata comes before the big COPY, so that after it
# there are just three small COPY layers (environment, code, Numba cache) and no RUN:
# with storage that copies each layer in full (buildah's vfs), every step counts.
# libgomp1: GNU OpenMP, the threading layer of Numba's parallel kernels and of MKL (without it Numba
# falls back to its workqueue layer, which aborts the process when two threads run parallel kernels at
# once, and MKL's GNU layer cannot load). Unpinned: bookworm's gcc-12 runtime (a cached layer keeps the
# version it got until the base image changes; the build needs the Debian mirror as well as PyPI).
FROM ${PYTHON_IMAGE} AS runtime
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install --yes --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 lu \
    && useradd --system --uid 10001 --gid lu --create-home --home-dir /home/lu lu
ENV PATH=/opt/app/bin:/opt/venv/bin:$PATH \
    PYTHONPATH=/opt/app \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NUMBA_CACHE_DIR=/home/lu/.cache/numba \
    LU_HOST=0.0.0.0 \
    LU_PORT=8000 \
    LU_GRPC_PORT=8001
WORKDIR /home/lu
# 8000: HTTP (native routes and /v2); 8001: gRPC (inference.GRPCInferenceService).
EXPOSE 8000 8001
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status != 200)"]
# The README's start command.
CMD ["python", "-m", "service"]
USER 10001:10001

FROM runtime AS cpu
ENV LU_DEVICE=cpu
COPY --from=deps-cpu /opt/venv /opt/venv
COPY --from=code /opt/app /opt/app
COPY --from=kernels --chown=10001:10001 /numba-cache /home/lu/.cache/numba

FROM runtime AS gpu
ENV LU_DEVICE=gpu \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
COPY --from=deps-gpu /opt/venv /opt/venv
COPY --from=code /opt/app /opt/app
# The CPU kernels too: LU_DEVICE=auto falls back to them on a host without a GPU.
COPY --from=kernels --chown=10001:10001 /numba-cache /home/lu/.cache/numba
