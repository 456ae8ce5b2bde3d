# syntax=docker/dockerfile:1
# The LU service, for GPU hosts (target gpu, the default) and CPU-only hosts (target cpu).
#
#   docker build -t lu-service:gpu .                              # CUDA 12 wheels
#   docker build -t lu-service:gpu-cu13 --build-arg CUDA=13 .     # CUDA 13 wheels
#   docker build -t lu-service:cpu --target cpu .                 # no CuPy at all
#
# Base: python slim plus CuPy's own CUDA wheels (cupy-cudaXXx[ctk] pulls cuBLAS,
# cuSOLVER, NVRTC and the runtime from PyPI), not an nvidia/cuda image: the CUDA
# runtime images carry the whole toolkit's runtime set (cuFFT, cuSPARSE, NPP, ...)
# on top of Ubuntu, while the service needs four libraries. The driver comes from
# the host through the NVIDIA Container Toolkit either way.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---------------------------------------------------------------- build: a virtual environment
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY deploy/constraints.txt deploy/constraints.txt
COPY pyproject.toml README.md ./
COPY lu_core lu_core
COPY service service
# Pinned: every package of the image comes from deploy/constraints.txt.
RUN pip install --constraint deploy/constraints.txt ".[server]"

FROM build AS build-gpu
ARG CUDA=12
ARG CUPY_VERSION=14.2.0
RUN pip install --constraint deploy/constraints.txt "cupy-cuda${CUDA}x[ctk]==${CUPY_VERSION}"

# ---------------------------------------------------------------- runtime: no compilers, non-root
FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 lu \
    && useradd --system --uid 10001 --gid lu --create-home --home-dir /home/lu lu
ENV PATH=/opt/venv/bin:$PATH \
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

FROM runtime AS cpu
COPY --from=build /opt/venv /opt/venv
USER 10001:10001
# Compile the CPU kernels into the image's Numba cache, so a container is ready in seconds.
RUN python -c "from service.app import warm_up; from service.device import CpuDevice; warm_up(CpuDevice())"
ENV LU_DEVICE=cpu
# The README's start command.
CMD ["python", "-m", "service"]

FROM runtime AS gpu
COPY --from=build-gpu /opt/venv /opt/venv
USER 10001:10001
RUN python -c "from service.app import warm_up; from service.device import CpuDevice; warm_up(CpuDevice())"
ENV LU_DEVICE=gpu \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
CMD ["python", "-m", "service"]
