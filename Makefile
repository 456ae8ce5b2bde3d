# The two commands of the README's quick start, and what they stand on.
# A fresh machine needs only python3 (>= 3.10) with venv, and make.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Which extras `make serve` installs: add cuda12 or cuda13 on a GPU host,
# e.g. `make serve EXTRAS=server,mkl,cuda12` (mkl: Intel MKL's LAPACK for large CPU matrices on
# Intel CPUs, and for the threaded getrf of float64 and complex ones of n 384-1024 on others; a no-op off Linux x86-64;
# EXTRAS=server runs them on SciPy's OpenBLAS).
EXTRAS ?= server,mkl

.PHONY: serve test bench calibrate clean gpu-proof gpu-wheels image image-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Installs the service and the client (the README's client examples import it) and starts
# the HTTP service (LU_ variables or ARGS="--port 9000 ..." configure it; on a host without
# a GPU it computes on the CPU and says so).
ARGS ?=
serve: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]" -e ./clients
	$(BIN)/python -m service $(ARGS)

# Installs the project with its dev extras, checks lint and format, runs every test.
# The kserve wheel is only downloaded, never installed: tests/deploy reads its resource
# models to check deploy/kserve/kserve.schema.json (installing it would bring pandas, grpcio-tools,
# the kubernetes client and its protobuf/starlette pins into the dev environment).
KSERVE_VERSION ?= 0.21.0
test: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[dev]" -e ./clients
	@test -f .cache/wheels/kserve-$(KSERVE_VERSION)-py3-none-any.whl || \
	  $(BIN)/python -m pip download --quiet --no-deps --dest .cache/wheels kserve==$(KSERVE_VERSION) || \
	  echo "kserve wheel not downloaded: the KServe schema drift check will skip"
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest

# Every benchmark suite (core-cpu, core-gpu where a GPU is visible, service); reports and
# plots in bench/results/. Pick suites with e.g. `make bench SUITES="core-cpu service"`.
SUITES ?= core-cpu core-gpu service
bench: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[bench]" -e ./clients
	$(BIN)/python -m bench --suite $(SUITES)

calibrate: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	$(BIN)/python -m bench.calibrate_cpu

# The GPU proof: every GPU check and benchmark in one command, results (at most 8 files)
# in OUT. On a device machine (no internet, no .venv): `make gpu-wheels` here first, carry
# .whl, then `make gpu-proof OUT=$$OUT` in two device commands of at most 6.25 and 8 min (15 minutes of device time per session):
# PARTS="env kernels tests service oom", then PARTS="kernels calibrate core-bench batching service-bench"
# (kernels again: from its cache, or compiled on a fresh machine, before the measurements).
# Without a GPU, `LU_DEVICE=cpu make gpu-proof OUT=dir` rehearses it (CI runs that).
OUT ?=
PARTS ?= env kernels tests service oom calibrate core-bench batching service-bench
PROOF_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
gpu-proof:
	@test -n "$(OUT)" || { echo "usage: make gpu-proof OUT=dir [PARTS=\"$(PARTS)\"]" >&2; exit 2; }
	$(PROOF_PYTHON) -m bench.gpu_proof --out "$(OUT)" --parts $(PARTS)

# Wheels the device machine lacks (Python 3.12, manylinux x86-64) into .whl (ignored by git).
gpu-wheels:
	$(PYTHON) -m bench.gpu_wheels --dest .whl

# Container images: docker where an engine runs, else buildah from a debootstrap base
# (deploy/image.sh). `make image-check` builds both and runs what CI checks in them.
TARGET ?= gpu
image:
	deploy/image.sh $(TARGET)

image-check: $(BIN)/python
	deploy/image_check.sh

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache .hypothesis build *.egg-info
