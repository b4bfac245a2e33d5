# Two set-up commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint unit bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpunode demo

lint: $(STAMP)
	$(BIN)/ruff check agents tests benchmarks
	$(BIN)/ruff format --check agents tests benchmarks
	$(BIN)/mypy --strict agents
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest -q

test: lint unit

bench: $(STAMP)
	$(BIN)/python benchmarks/nvml_sim.py
	$(BIN)/python benchmarks/device_plugin.py
	$(BIN)/python benchmarks/feature_discovery.py
	$(BIN)/python benchmarks/exporter.py
	$(BIN)/python benchmarks/kube_layer.py
	$(BIN)/python benchmarks/mig.py
	$(BIN)/python benchmarks/driver_loader.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
