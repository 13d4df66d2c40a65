# tinylm: `make train` runs the default recipe, `make test` runs the tests; both set up from nothing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
CONFIG ?= configs/shakespeare-char-cpu.yaml

.PHONY: setup test train prepare bench clean

setup: $(VENV)/.installed

# Reinstall only when the project's dependencies change.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

test: setup
	$(PY) -m pytest -q -n 2 --dist loadfile

train: setup
	$(VENV)/bin/tinylm fit --config $(CONFIG)

prepare: setup
	$(VENV)/bin/tinylm prepare --config $(CONFIG)

bench: setup
	$(PY) benchmarks/run_all.py

clean:
	rm -rf runs lightning_logs wandb .pytest_cache
