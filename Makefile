# Two commands do everything on a fresh machine: `make demo` and `make test`.
# CPU machines get the CPU build of torch pinned below; on a GPU machine use
#   make demo TORCH="torch --index-url https://download.pytorch.org/whl/cu124"   (or your CUDA build)
PY      ?= python3
VENV    ?= .venv
TORCH   ?= torch==2.13.0
EXTRAS  ?= dev,dali
BIN      = $(VENV)/bin

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[$(EXTRAS)]"
	touch $@

.PHONY: setup demo test test-gpu bench
setup: $(BIN)/.installed

demo: $(BIN)/.installed
	$(BIN)/fastdata demo --out sample

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q

test-gpu: $(BIN)/.installed
	$(BIN)/python -m pytest -q -m gpu tests/gpu

bench: $(BIN)/.installed
	$(BIN)/python benchmarks/build.py
	$(BIN)/python benchmarks/loader.py
