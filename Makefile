# The two commands of the README's quick start, and what they stand on.
# A fresh machine needs only python3 (>= 3.10) with venv, and make.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Which extras `make serve` installs: add cuda12 or cuda13 on a GPU host,
# e.g. `make serve EXTRAS=server,cuda12`.
EXTRAS ?= server

.PHONY: serve test lint bench calibrate clean

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

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache .hypothesis build *.egg-info
