# Two set-up commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint unit bench clean install-systemd image hw-check

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpunode demo

# On a machine with a real NVIDIA GPU and driver: every agent read-only, real NVML vs the matching preset
# (README "Checking real hardware"); exit 2 without a driver.
hw-check: $(STAMP)
	$(BIN)/gpunode dev hw-check

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
	$(BIN)/python benchmarks/cdi.py
	$(BIN)/python benchmarks/driver_loader.py
	$(BIN)/python benchmarks/startup.py
	$(BIN)/python benchmarks/operator_bench.py

# The image built with podman from a local Debian 12 base and checked in it (containers/ci/, root only).
image:
	containers/ci/build-and-check.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis

# Bare-metal units (docs/systemd.md): units to $(DESTDIR)$(SYSCONFDIR)/systemd/system, env examples to
# $(DESTDIR)$(SYSCONFDIR)/default/<unit> unless one is there already. Never runs systemctl.
SYSCONFDIR ?= $(PREFIX)/etc
PREFIX     ?=
install-systemd:
	install -d $(DESTDIR)$(SYSCONFDIR)/systemd/system $(DESTDIR)$(SYSCONFDIR)/default
	install -m 0644 systemd/*.service $(DESTDIR)$(SYSCONFDIR)/systemd/system/
	@for f in systemd/env/*.env; do \
		dest=$(DESTDIR)$(SYSCONFDIR)/default/$$(basename $$f .env); \
		if [ -e $$dest ]; then echo "kept $$dest"; else install -m 0644 $$f $$dest; fi; \
	done
	@echo "now: systemctl daemon-reload && systemctl enable --now gpunode-driver-loader gpunode-mig-manager gpunode-device-plugin gpunode-feature-discovery gpunode-exporter"
