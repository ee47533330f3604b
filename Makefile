# Two entry points on a fresh machine: `make run` (generate, embedded default) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# A CPU machine needs no multi-GB CUDA wheel; TORCH_SPEC lets a GPU machine ask for another build.
TORCH_SPEC ?= torch==2.13.0
# Test processes (pytest-xdist); each test file runs whole on one of them, so module fixtures are
# made once. Two keep a 2-core machine busy (the suite alone leaves half of it idle).
TEST_WORKERS ?= 2

.PHONY: install run test test-all catalog clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install "$(TORCH_SPEC)" || $(BIN)/pip install torch
	$(BIN)/pip install -e ".[dev]"
	touch $@

run: install
	$(BIN)/python -m pipelines.generate $(ARGS)

test: install
	$(BIN)/python -m pytest -m "not gpu" -n $(TEST_WORKERS) --dist loadfile $(ARGS)

catalog: install
	$(BIN)/python -m opsynth.catalog

clean:
	rm -rf $(VENV) outputs
