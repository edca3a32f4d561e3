# The two Quick start commands: `make example` and `make test`.
# Both create .venv, install stockade into it and, where the machine allows
# (root or passwordless sudo with apt-get), the system packages it uses.

PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: example test lint bench system-packages clean

# System packages first: pip builds the landlock launcher (C) when a compiler is there.
$(BIN)/stockade: pyproject.toml setup.py src/stockade/sandbox/_jail.c
	@PYTHON=$(PYTHON) sh scripts/install-system-packages.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	@# An editable install is not byte-compiled, and with PYTHONDONTWRITEBYTECODE
	@# set nothing ever would be: every command would compile stockade again.
	$(BIN)/python -m compileall -q src
	touch $@

system-packages:
	@sh scripts/install-system-packages.sh

example: $(BIN)/stockade system-packages
	$(BIN)/stockade doctor
	$(BIN)/stockade run examples/pipeline/workflow.yaml

test: $(BIN)/stockade system-packages
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: $(BIN)/stockade
	$(BIN)/python bench/bench_fanout.py
	$(BIN)/python bench/bench_sandbox.py
	$(BIN)/python bench/bench_sandbox.py --engine --backend bwrap --backend landlock --backend none
	$(BIN)/python bench/bench_engine.py
	$(BIN)/python bench/bench_floor.py
	$(BIN)/python bench/bench_interrupt.py
	$(BIN)/python bench/bench_keep.py
	$(BIN)/python bench/bench_spread.py
	$(BIN)/python bench/bench_threads.py
	$(BIN)/python bench/bench_reuse.py
	$(BIN)/python bench/bench_inputs.py --size 512M --items 4
	$(BIN)/python bench/bench_agent.py
	$(BIN)/python bench/bench_publish.py
	$(BIN)/python bench/bench_ui.py
	$(BIN)/python bench/bench_dask.py

clean:
	rm -rf $(VENV) .stockade .pytest_cache .mypy_cache .ruff_cache
